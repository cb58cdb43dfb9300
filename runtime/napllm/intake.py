"""Reading a napplet's request: one straight pipeline, each stage calling only downwards.

Rules (NAP-LLM, Wire Protocol, Schemas, Message)
- `read_request` runs three stages in order, and a message that fails one
  never reaches the next: the envelope's shape (`wire.parse_envelope`:
  known type, usable id, fields, plain JSON), then the records
  (`records.parse_requirements`, `records.parse_generation_request`, the
  text fields `handle` and `requestId`), then the conversation rules
  (`conversation.validate_conversation`: placements, toolResult adjacency,
  tool choice against tools).
- A failure at the second or third stage is a `wire.Malformed` with the
  stage's `invalid-request` error, answered by the shell with exactly one
  `<type>.result`; an unexpected exception is the same fixed
  `invalid-request`, never a crash. Messages never quote napplet text.
"""

from __future__ import annotations

from dataclasses import dataclass

from .conversation import validate_conversation
from .errors import NapError, invalid
from .records import (
    GenerationRequest,
    RecordError,
    Requirements,
    parse_generation_request,
    parse_requirements,
)
from .wire import Dropped, Envelope, Malformed, parse_envelope


@dataclass(frozen=True)
class Select:
    """`llm.select`: ask the user to choose a connection meeting `requirements`."""

    id: str
    requirements: Requirements


@dataclass(frozen=True)
class Describe:
    """`llm.describe`: revalidate `handle`."""

    id: str
    handle: str


@dataclass(frozen=True)
class Generate:
    """`llm.generate`: a parsed, conversation-checked GenerationRequest."""

    id: str
    request: GenerationRequest


@dataclass(frozen=True)
class Cancel:
    """`llm.cancel`: cancel this endpoint's active generation `request_id`."""

    id: str
    request_id: str


Incoming = Select | Describe | Generate | Cancel
Parsed = Incoming | Malformed | Dropped


def read_request(raw: object) -> Parsed:
    """One received message -> a typed request, a `Malformed` or a `Dropped`.

    Never raises; see the module rules for the stages.
    """
    shaped = parse_envelope(raw)  # 1. envelope shape
    if not isinstance(shaped, Envelope):
        return shaped
    try:
        incoming = _records(shaped)  # 2. records
        if isinstance(incoming, Generate):
            validate_conversation(incoming.request)  # 3. conversation rules
    except NapError as error:
        return Malformed(shaped.type, shaped.id, error)
    except Exception:  # defensive: a bug must never escape as a crash
        return Malformed(shaped.type, shaped.id, invalid("The request could not be parsed."))
    return incoming


def _records(envelope: Envelope) -> Incoming:
    fields = envelope.fields
    if envelope.type == "llm.select":
        if "requirements" not in fields:
            return Select(envelope.id, Requirements())
        if fields["requirements"] is None:
            raise invalid("Invalid envelope: explicit null for requirements.")
        return Select(envelope.id, parse_requirements(fields["requirements"]))
    if envelope.type == "llm.describe":
        return Describe(envelope.id, _text_field(fields, "handle"))
    if envelope.type == "llm.cancel":
        return Cancel(envelope.id, _text_field(fields, "requestId"))
    return Generate(envelope.id, parse_generation_request(fields["request"]))


def _text_field(fields: dict[str, object], key: str) -> str:
    value = fields[key]
    if not isinstance(value, str) or not value:
        raise RecordError(f"Invalid envelope: {key} must be non-empty text.")
    return value
