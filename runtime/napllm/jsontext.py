"""The one strict reader for JSON text that crosses into the runtime.

Every text from outside (a napplet's envelope, a provider's SSE payload, a
tool call's arguments, a `format: "json"` answer, an engine's chunk batch, a
stored connection) is read here before anything else touches it.

Rules (RFC 8259; NAP-LLM, Schemas: "invalid encodings"; docs/design.md,
"Style": every text from outside is read by one strict reader with limits)
- RFC 8259 JSON only: no `NaN`, `Infinity` or `-Infinity`, no duplicate
  object keys, no trailing data.
- Every number must fit a double exactly enough to round-trip through
  JavaScript: floats must be finite (`1e400` is refused, not made
  infinite) and integers must lie within +-(2**53 - 1), where JavaScript
  still represents them exactly (Pyodide would otherwise hand a `BigInt`
  to the page).
- Text must be valid Unicode: a lone UTF-16 surrogate (escaped as
  `\\ud83d` or already present in the input string) is refused, unless the
  caller asks to keep them (`allow_lone_surrogates`): a napplet's envelope
  (so the wire layer can answer `invalid-request` with the envelope's id)
  and streamed provider payloads, whose text fragments may split a UTF-16
  pair between two events (the pair is joined, or an unpaired half
  replaced, by `streaming.SurrogateJoiner` before any text is emitted).
- Limits are checked *before* any recursive parsing: the text's length
  (`max_chars`) first, then the nesting depth (`max_depth`) by an
  iterative scan, so a hostile text cannot exhaust the stack (CPython's
  recursion limit, or the WebAssembly stack under Pyodide, where an
  overflow is a fatal error for the whole page).

Why not a library: the standard `json` module is the parser; this module
only adds the limits and refusals the protocol needs around it, which no
well-kept pure-Python package (that also runs in Pyodide) offers as a set.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

#: Default bound on nesting (objects and arrays together), used for provider
#: values such as tool-call arguments. pydantic's serializer in Pyodide stops
#: at 49 nested values: arguments of depth 40 serialise inside a Generation,
#: and their replay sits at depth 46 of a napplet envelope, within
#: `wire.MAX_DEPTH` (48).
DEFAULT_MAX_DEPTH = 40
#: Default bound on the text's length, in characters.
DEFAULT_MAX_CHARS = 16 * 1024 * 1024
#: Largest integer magnitude JavaScript represents exactly (Number.MAX_SAFE_INTEGER).
MAX_SAFE_INTEGER = 2**53 - 1

# A complete JSON string literal (unrolled loop: linear, no backtracking).
_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")
# 16 digits or more in a row: the only place an unsafe integer literal can be.
_LONG_DIGITS = re.compile(r"[0-9]{16}")
_PAIR = re.compile(r"\[\]|\{\}")
_SURROGATE = re.compile("[\ud800-\udfff]")


class JsonTextError(ValueError):
    """Text that is not strict JSON within the limits.

    The message is the runtime's own sentence; it never quotes the text.
    """


def nesting_depth(text: str, limit: int) -> int:
    """The bracket nesting depth of JSON `text`, counted up to `limit + 1`.

    Iterative (never recursive): string literals are removed first, then
    innermost `[]`/`{}` pairs are deleted one layer per pass, so the work is
    at most `limit + 1` linear passes over the brackets.

    Raises `JsonTextError` when the brackets cannot all pair up (no valid
    JSON text is unbalanced), so the parser never sees such a text.
    """
    brackets = _NOT_BRACKET.sub("", _STRING.sub("", text))
    depth = 0
    while brackets:
        reduced = _PAIR.sub("", brackets)
        if reduced == brackets:
            raise JsonTextError("The text is not valid JSON.")
        depth += 1
        if depth > limit:
            return depth
        brackets = reduced
    return depth


def _no_constant(name: str) -> Any:
    raise JsonTextError("The text contains a number JSON cannot represent.")


def _finite_float(literal: str) -> float:
    value = float(literal)
    if not math.isfinite(value):
        raise JsonTextError("The text contains a number too large for a double.")
    return value


def _safe_int(literal: str) -> int:
    if len(literal) > 17:  # more digits than any safe integer
        raise JsonTextError("The text contains an integer too large to represent exactly.")
    value = int(literal)
    if abs(value) > MAX_SAFE_INTEGER:
        raise JsonTextError("The text contains an integer too large to represent exactly.")
    return value


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise JsonTextError("The text contains a duplicate object key.")
        out[key] = value
    return out


def _check_text(value: Any) -> None:
    """Refuse lone surrogates anywhere in a parsed value (iterative walk)."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if _SURROGATE.search(item):
                raise JsonTextError("The text contains a lone UTF-16 surrogate.")
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)


def read_json(
    text: str | bytes,
    *,
    max_chars: int = DEFAULT_MAX_CHARS,
    max_depth: int = DEFAULT_MAX_DEPTH,
    allow_lone_surrogates: bool = False,
) -> Any:
    """Parse `text` as strict JSON within limits; the parsed value.

    `text`: a `str`, or `bytes` decoded as strict UTF-8. `max_chars`: the
    largest accepted length in characters; `max_depth`: the deepest
    accepted nesting of objects and arrays (a scalar has depth 0);
    `allow_lone_surrogates`: keep lone UTF-16 surrogates in strings (see
    the module rules) instead of refusing the text.

    Raises `JsonTextError` (a `ValueError`) for invalid UTF-8, text over
    `max_chars`, nesting over `max_depth`, non-JSON, `NaN`/`Infinity`,
    non-finite or unsafe numbers, duplicate keys and (unless allowed) lone
    surrogates.
    """
    if isinstance(text, bytes | bytearray):
        if len(text) > 4 * max_chars:
            raise JsonTextError("The text exceeds the size limit.")
        try:
            text = bytes(text).decode("utf-8")
        except UnicodeDecodeError:
            raise JsonTextError("The text is not valid UTF-8.") from None
    if not isinstance(text, str):
        raise JsonTextError("Only text can be read as JSON.")
    if len(text) > max_chars:
        raise JsonTextError("The text exceeds the size limit.")
    # No text nests deeper than it has opening brackets: most texts (small
    # envelopes, merged chunk batches) skip the scan. Likewise an integer
    # literal of at most 15 digits is always safe, so the per-integer check
    # runs only when the text has a longer run of digits somewhere.
    opening = text.count("{") + text.count("[")
    if opening > max_depth and nesting_depth(text, max_depth) > max_depth:
        raise JsonTextError("The text is nested too deeply.")
    try:
        value = json.loads(
            text,
            parse_constant=_no_constant,
            parse_float=_finite_float,
            parse_int=_safe_int if _LONG_DIGITS.search(text) else None,
            object_pairs_hook=_unique_keys,
        )
    except JsonTextError:
        raise
    except (ValueError, RecursionError):
        raise JsonTextError("The text is not valid JSON.") from None
    if not allow_lone_surrogates:
        _check_text(value)
    return value


def read_json_object(
    text: str | bytes,
    *,
    max_chars: int = DEFAULT_MAX_CHARS,
    max_depth: int = DEFAULT_MAX_DEPTH,
    allow_lone_surrogates: bool = False,
) -> dict[str, Any]:
    """`read_json`, and the value must be a JSON object (a `dict`).

    Raises `JsonTextError` as `read_json` does, and for any other value.
    """
    value = read_json(
        text,
        max_chars=max_chars,
        max_depth=max_depth,
        allow_lone_surrogates=allow_lone_surrogates,
    )
    if not isinstance(value, dict):
        raise JsonTextError("The text is not a JSON object.")
    return value


def read_stream_payload(text: str | bytes) -> Any:
    """`read_json` for one streamed provider payload (an SSE event's data, an
    engine's chunk batch): every rule and limit applies, but lone UTF-16
    surrogates are kept, because a text delta may carry one half of a pair
    whose other half arrives in the next payload. The output assembler joins
    or replaces them (`streaming.SurrogateJoiner`) before any text reaches a
    napplet, and refuses them in completed tool-call arguments.

    Raises `JsonTextError` as `read_json` does.
    """
    return read_json(text, allow_lone_surrogates=True)
