"""NAP-LLM envelopes: their shape in, and outgoing envelopes built.

This is the first stage of reading a napplet's message (`intake.read_request`
runs the stages in order: envelope shape here, then the records
(`records.py`), then the conversation rules (`conversation.py`)); this module
calls no later stage.

Rules (NAP-LLM, Wire Protocol; NIP-5D)
- An envelope is a JSON object `{"type": "llm.<action>", ...payload}`.
  Incoming types: `llm.select` (`id`, optional `requirements`),
  `llm.describe` (`id`, `handle`), `llm.generate` (`id`, `request`),
  `llm.cancel` (`id`, `requestId`).
- Anything that is not an object with a text `type`, and every unknown
  `type` (including result types sent the wrong way), is ignored silently:
  no reply, no error (NIP-5D: unknown types MUST be silently ignored).
- A *usable id* is text of 1 to `MAX_ID_LENGTH` characters that encodes as
  UTF-8. A known type without a usable id cannot be correlated, so it gets
  no reply either: it is dropped (and shown in the shell's inspector only).
- A known type with a usable id whose envelope is malformed (unknown
  envelope fields, missing fields, values JSON cannot carry) gets exactly
  one `<type>.result` with `error.code = "invalid-request"` (`Malformed`);
  otherwise it is an `Envelope` whose payload the later stages read.
- Values must be plain JSON: objects with text keys, lists, text (no lone
  surrogates), finite numbers, booleans, null; nesting at most `MAX_DEPTH`.
- Envelope text is read by the one strict reader (`jsontext.read_json`,
  through `loads_strict`) with `PARSE_DEPTH` as its pre-parse bound, so a
  too-deep envelope that still names a usable id gets `invalid-request`
  from `check_plain_json` instead of vanishing. `MAX_DEPTH` is chosen so
  that nothing accepted can reach pydantic's serializer limit (49 levels
  of nested values under Pyodide) when it is serialised again: a tool's
  `parameters` sit at depth 5 of an envelope (<= 44 levels of their own),
  and a replayed toolCall's `arguments` at depth 7, which admits every
  `arguments` object a provider may return (`jsontext.DEFAULT_MAX_DEPTH`).
- Error messages never quote napplet text: a field is named by its
  position or a fixed description (NAP-LLM, Security Considerations).
- Outgoing envelopes are built here, with the field order of the spec's
  examples: results carry `id` and exactly one of the success payload or
  `error`; `llm.delta` carries the Delta fields and no `id`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from .errors import ErrorCode, NapError, invalid
from .jsontext import DEFAULT_MAX_DEPTH, read_json

if TYPE_CHECKING:  # outgoing envelopes only call the records' own `to_json`
    from .records import Generation

MAX_ID_LENGTH = 256
#: Deepest accepted envelope nesting (objects and arrays; see module rules).
MAX_DEPTH = 48
#: Pre-parse bound of envelope text: deeper text is not parsed at all.
PARSE_DEPTH = 128
#: Depth of a replayed toolCall's `arguments` object inside an envelope
#: (envelope, request, messages, message, content, part, arguments).
_ARGUMENTS_AT = 7
assert DEFAULT_MAX_DEPTH + _ARGUMENTS_AT - 1 <= MAX_DEPTH

REQUEST_TYPES = ("llm.select", "llm.describe", "llm.generate", "llm.cancel")
_FIELDS: dict[str, tuple[frozenset[str], frozenset[str]]] = {
    # type: (required payload fields, optional payload fields)
    "llm.select": (frozenset({"id"}), frozenset({"requirements"})),
    "llm.describe": (frozenset({"id", "handle"}), frozenset()),
    "llm.generate": (frozenset({"id", "request"}), frozenset()),
    "llm.cancel": (frozenset({"id", "requestId"}), frozenset()),
}


@dataclass(frozen=True)
class Envelope:
    """A known request type with a usable id and a well-shaped envelope.

    `fields`: the envelope's members other than `type` and `id`, plain JSON
    (checked by `check_plain_json`), exactly the required ones plus any of
    the optional ones of `type`; their contents are not read yet.
    """

    type: str
    id: str
    fields: dict[str, Any]


@dataclass(frozen=True)
class Malformed:
    """A known request type with a usable id whose payload is invalid."""

    type: str
    id: str
    error: NapError


@dataclass(frozen=True)
class Dropped:
    """Nothing to answer: not an envelope, unknown type, or no usable id."""

    reason: str
    type: str | None = None


Shaped = Envelope | Malformed | Dropped


@dataclass(frozen=True)
class Unclonable:
    """A message the host page could not express as JSON (Map, undefined, ...).

    The page reports its `type` and `id` when they were plain text, so a
    usable id still gets `invalid-request`.
    """

    type: str | None
    id: str | None
    too_large: bool = False


def usable_id(value: object) -> bool:
    """Whether `value` can correlate a reply (non-empty text, bounded, valid UTF-8)."""
    return isinstance(value, str) and 0 < len(value) <= MAX_ID_LENGTH and _utf8(value)


def _utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def check_plain_json(value: object, depth: int = 0) -> str | None:
    """`None` if `value` is plain JSON, else a safe reason (no values echoed)."""
    if depth > MAX_DEPTH:
        return "nesting too deep"
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, int):
        return None
    if isinstance(value, float):
        return None if math.isfinite(value) else "non-finite number"
    if isinstance(value, str):
        return None if _utf8(value) else "text is not valid Unicode"
    if isinstance(value, list):
        for item in value:
            reason = check_plain_json(item, depth + 1)
            if reason:
                return reason
        return None
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str) or not _utf8(key):
                return "object keys must be text"
            reason = check_plain_json(item, depth + 1)
            if reason:
                return reason
        return None
    return "value is not JSON"


def loads_strict(text: str) -> Any:
    """Parse an envelope's JSON text with the strict reader (`jsontext.read_json`).

    Refuses NaN/Infinity, unsafe numbers, duplicate keys and nesting deeper
    than `PARSE_DEPTH`; keeps lone surrogates so that `parse_envelope` can
    answer them with `invalid-request`. Raises `jsontext.JsonTextError`
    (a `ValueError`) for anything else.
    """
    return read_json(text, max_depth=PARSE_DEPTH, allow_lone_surrogates=True)


def parse_envelope(raw: object) -> Shaped:
    """Check one received message's envelope: an Envelope, a Malformed, or Dropped.

    Never raises. Implements the rules at the top of this module.
    """
    if isinstance(raw, Unclonable):
        if raw.type in REQUEST_TYPES and usable_id(raw.id):
            assert raw.type is not None and raw.id is not None
            if raw.too_large:
                error = NapError(ErrorCode.QUOTA_EXCEEDED, "The message exceeds the size limit.")
            else:
                error = invalid("The message contains values JSON cannot represent.")
            return Malformed(raw.type, raw.id, error)
        return Dropped("message not representable as JSON", raw.type)
    if not isinstance(raw, dict) or not isinstance(raw.get("type"), str):
        return Dropped("not an envelope")
    kind = raw["type"]
    if kind not in _FIELDS:
        return Dropped("unknown type", kind if _utf8(kind) else None)
    if not usable_id(raw.get("id")):
        return Dropped("no usable id", kind)
    rid: str = raw["id"]
    try:
        return _shape(kind, rid, raw)
    except NapError as error:
        return Malformed(kind, rid, error)
    except Exception:  # defensive: a bug must never escape as a crash
        return Malformed(kind, rid, invalid("The request could not be parsed."))


def _shape(kind: str, rid: str, raw: dict[str, Any]) -> Envelope:
    required, optional = _FIELDS[kind]
    for position, key in enumerate(raw, start=1):
        if key != "type" and key not in required and key not in optional:
            raise invalid(f"Invalid envelope: member {position} is an unknown field.")
    for key in required:
        if key not in raw:
            raise invalid(f"Invalid envelope: missing field {key}.")
    reason = check_plain_json(raw)
    if reason:
        raise invalid(f"Invalid envelope: {reason}.")
    return Envelope(kind, rid, {k: v for k, v in raw.items() if k not in ("type", "id")})


# --------------------------------------------------------------------------
# Outgoing envelopes


def result_type(kind: str) -> str:
    """The result type answering request type `kind` (`llm.x` -> `llm.x.result`)."""
    return f"{kind}.result"


def error_result(kind: str, rid: str, error: NapError) -> dict[str, Any]:
    """`{"type": "<kind>.result", "id", "error": {"code", "message"}}`."""
    return {"type": result_type(kind), "id": rid, "error": error.to_record()}


def model_result(kind: str, rid: str, model: dict[str, Any]) -> dict[str, Any]:
    """`llm.select.result` / `llm.describe.result` with a Model record."""
    return {"type": result_type(kind), "id": rid, "model": model}


def generation_result(rid: str, generation: Generation) -> dict[str, Any]:
    """`llm.generate.result` with a Generation."""
    return {"type": "llm.generate.result", "id": rid, "result": generation.to_json()}


def cancel_result(rid: str, cancelled: bool) -> dict[str, Any]:
    """`llm.cancel.result` with `cancelled`."""
    return {"type": "llm.cancel.result", "id": rid, "cancelled": cancelled}


class DeltaFields(Protocol):
    """What `delta_envelope` reads: the `records.Delta` record's fields.

    A `records.Delta` has them, and so has the delta stream's queued event
    (`streaming.DeltaStream`), which builds one envelope per sent event
    without validating a record on that hot path.
    """

    @property
    def requestId(self) -> str: ...
    @property
    def sequence(self) -> int: ...
    @property
    def event(self) -> str: ...
    @property
    def block(self) -> str: ...
    @property
    def blockIndex(self) -> int: ...
    @property
    def text(self) -> str | None: ...
    @property
    def toolCallId(self) -> str | None: ...
    @property
    def name(self) -> str | None: ...


def delta_envelope(delta: DeltaFields) -> dict[str, Any]:
    """`llm.delta` with the Delta fields (no `id`; NAP-LLM, Delta).

    Exactly `records.Delta`'s JSON shape, in its field order: `text` only on
    a `delta` event, `toolCallId` and `name` only on a toolCall `start`. The
    only builder of delta envelopes.
    """
    envelope: dict[str, Any] = {
        "type": "llm.delta",
        "requestId": delta.requestId,
        "sequence": delta.sequence,
        "event": delta.event,
        "block": delta.block,
        "blockIndex": delta.blockIndex,
    }
    if delta.event == "delta":
        envelope["text"] = delta.text
    elif delta.event == "start" and delta.block == "toolCall":
        envelope["toolCallId"] = delta.toolCallId
        envelope["name"] = delta.name
    return envelope
