"""Building napplet -> shell envelopes, checked by the shell's own code before sending.

Rules (NAP-LLM, Schemas, Message, Tool, Wire Protocol)
- One source: an envelope is checked by the very functions the shell runs
  on it (`intake.read_request`: the envelope's shape, the records, the
  conversation rules), after a JSON round trip that gives it the value the
  page will read. A request the shell would answer with `invalid-request`
  raises `InvalidRequestError` with the shell's own message, and nothing
  is sent.
- The page refuses envelopes over `MAX_WIRE_CHARS` of JSON text
  (web/js/wire.js): a larger one raises `QuotaExceededError` here.
- When the Model record of the request's handle is known (from `select` or
  `describe`), the shell's capability check (`translate.check_supported`)
  runs against what that record declares: a request the connection cannot
  take raises `UnsupportedError`. Facts the record does not carry (the
  temperature range, images inside tool results, reasoning state) are left
  to the shell, which answers `unsupported` itself.
- Shorthands: a `str` is one user message; a message dict with `text` and no
  `content` gets `content: [{"type": "text", "text": ...}]`; a
  `records.Message` is used as its JSON. Everything else is sent as given.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import BaseModel

from ..connection_records import Capabilities
from ..errors import NapError
from ..intake import Generate, read_request
from ..records import ModelRecord
from ..translate import check_supported
from ..wire import Dropped, Malformed
from .errors import (
    ERROR_CLASSES,
    InvalidRequestError,
    LlmError,
    QuotaExceededError,
    UnknownCodeError,
)

#: Largest envelope the page accepts, in UTF-16 code units of JSON text
#: (web/js/wire.js `MAX_WIRE_CHARS`).
MAX_WIRE_CHARS = 8 * 1024 * 1024

#: A message as the API accepts it: a NAP-LLM Message dict (or its `text`
#: shorthand) or a `records.Message`.
MessageLike = Mapping[str, Any] | BaseModel
#: A conversation: one user text, or messages in order.
Messages = str | Sequence[MessageLike]


def user_text(text: str) -> dict[str, Any]:
    """`{"role": "user", "content": [{"type": "text", "text": text}]}`."""
    return {"role": "user", "content": [{"type": "text", "text": text}]}


def to_messages(messages: Messages) -> list[dict[str, Any]]:
    """NAP-LLM Message dicts from `messages` (see the module's shorthands).

    Never validates: the shell's checks run on the whole envelope in
    `checked`. A value of another type is left for them to refuse.
    """
    if isinstance(messages, str):
        return [user_text(messages)]
    out: list[dict[str, Any]] = []
    for message in messages:
        if isinstance(message, BaseModel):
            out.append(message.model_dump(mode="json", exclude_none=True, by_alias=True))
        elif isinstance(message, Mapping) and "text" in message and "content" not in message:
            rest = {k: v for k, v in message.items() if k != "text"}
            out.append({**rest, "content": [{"type": "text", "text": message["text"]}]})
        else:
            out.append(message)  # type: ignore[arg-type]  # checked by the shell's code
    return out


def nap_error(error: NapError) -> LlmError:
    """The API's exception for a runtime `NapError` (same code, same message)."""
    cls = ERROR_CLASSES.get(error.code.value)
    return cls(error.message) if cls is not None else UnknownCodeError(error.message)


def capabilities_of(model: ModelRecord) -> Capabilities:
    """What a Model record declares, as the shell's `Capabilities`.

    Undeclared facts are taken as permissive (any temperature, images in
    tool results when images are accepted, no reasoning state), so this
    check never refuses what the shell might accept.
    """
    return Capabilities(
        images=model.images,
        images_in_tool_results=model.images,
        json_output=model.json_,
        tools=model.tools,
        tool_choice_modes=tuple(model.toolChoiceModes),
        temperature=(-math.inf, math.inf),
    )


def _wire_chars(text: str) -> int:
    """Length of `text` in UTF-16 code units, as JavaScript counts it."""
    return len(text) + sum(1 for ch in text if ord(ch) > 0xFFFF)


def checked(envelope: dict[str, Any], model: ModelRecord | None = None) -> dict[str, Any]:
    """The envelope as the page will read it, after the shell's own checks.

    `envelope`: `{"type": "llm.<action>", "id", ...}`; `model`: the Model
    record of the request's handle when known. Returns the JSON-normalised
    envelope to send. Raises `InvalidRequestError` (values JSON cannot
    carry, or what the shell's intake refuses), `QuotaExceededError` (over
    `MAX_WIRE_CHARS`) or `UnsupportedError` (capability check, see the
    module rules). Implements NAP-LLM, Schemas and Wire Protocol.
    """
    try:
        text = json.dumps(envelope, ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError, RecursionError):
        raise InvalidRequestError("The message contains values JSON cannot represent.") from None
    if _wire_chars(text) > MAX_WIRE_CHARS:
        raise QuotaExceededError("The message exceeds the size limit.")
    plain: dict[str, Any] = json.loads(text)
    parsed = read_request(plain)
    if isinstance(parsed, Malformed):
        raise nap_error(parsed.error)
    if isinstance(parsed, Dropped):
        raise InvalidRequestError(f"The shell would drop this message ({parsed.reason}).")
    if isinstance(parsed, Generate) and model is not None and model.handle == parsed.request.handle:
        try:
            check_supported(parsed.request, capabilities_of(model))
        except NapError as error:
            raise nap_error(error) from None
    return plain
