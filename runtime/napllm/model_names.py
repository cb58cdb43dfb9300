"""Model ids as dialogs show them: which ids a listing may show, and an id in words.

Split from `kinds` (which re-exports them) so that the shell's ports can
name a model without importing the kinds table, which reads the engines'
registry.

Rules
- A model id a server lists is kept and shown only when every character is
  visible and does not reorder text (`model_id_shown`), at most
  `MAX_LISTED_MODELS` of one listing.
- A model's name in words (`model_display_name`) is shown next to its id,
  never instead of it.
"""

from __future__ import annotations

import re
import unicodedata

#: At most this many model ids of one server's listing are kept.
MAX_LISTED_MODELS = 200
#: Unicode categories a shown model id may not contain: controls, format
#: characters (bidi overrides and isolates, zero-width, tags), surrogates,
#: private use, unassigned, line and paragraph separators.
_UNSHOWN_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"})


def model_id_shown(value: object) -> bool:
    """Whether a model id a server lists may be kept and shown (as text) in dialogs.

    1..200 characters, none of them invisible or reordering
    (`_UNSHOWN_CATEGORIES`), so a hostile listing cannot make one id look
    like another in the chooser, the form or the consent dialog. Every
    listing parser (`discovery.model_ids`, both `discover_models`) keeps
    only such ids, at most `MAX_LISTED_MODELS` of them.
    """
    if not isinstance(value, str) or not 1 <= len(value) <= 200:
        return False
    return all(unicodedata.category(ch) not in _UNSHOWN_CATEGORIES for ch in value)


_QUANT = re.compile(r"(?i)[-_.](?:q\d\w*|f16|f32|bf16|fp16|fp32|int4|int8|mlc|gguf|onnx|awq|gptq)$")


def model_display_name(model: str) -> str:
    """A model id in words for dialogs.

    For example "Llama-3.2-1B-Instruct-q4f16_1-MLC" gives "Llama 3.2 1B Instruct".
    Drops a folder or owner (`owner/name`), a `.gguf` file suffix and trailing
    quantisation or format tags, and puts spaces for `-` and `_`. Returns the
    id unchanged when nothing would be left. The id itself is always shown
    next to it.
    """
    name = model.rsplit("/", 1)[-1]
    name = re.sub(r"(?i)\.gguf$", "", name)
    previous = None
    while previous != name:
        previous = name
        name = _QUANT.sub("", name)
    words = " ".join(part for part in re.split(r"[-_]+", name) if part)
    return words or model
