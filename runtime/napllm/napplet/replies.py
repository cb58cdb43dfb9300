"""Reading the shell's replies with the runtime's own output records.

Rules (NAP-LLM, Model, Generation, Delta, Wire Protocol)
- A result carries `id` and exactly one of its success payload or `error`;
  an Error record becomes the `LlmError` of its code
  (`errors.error_from_record`).
- Model records are `records.ModelRecord`, generations `records.Generation`
  and deltas `records.Delta`, validated as the runtime validates what it
  builds; a reply that fails is a `ProtocolError`, never a wrong value.
- `Reply` is the napplet's view of one terminal result: the authoritative
  `content` (it replaces whatever deltas showed), `finish`, `usage`, and the
  helpers `text` (concatenated text parts) and `tool_calls`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from pydantic import ValidationError

from ..jsontext import JsonTextError, read_json
from ..records import Delta, Generation, ModelRecord, TextPart, ThinkingPart, ToolCallPart, Usage
from .errors import ProtocolError, error_from_record

Finish = Literal["stop", "length", "refusal", "toolUse"]


@dataclass(frozen=True)
class Reply:
    """One terminal `llm.generate.result` (NAP-LLM, Generation).

    `request_id`: the generation's id; `generation`: the validated
    `records.Generation` (`content`, `finish`, `usage`).
    """

    request_id: str
    generation: Generation

    @property
    def finish(self) -> Finish:
        """`stop` (normal completion), `length`, `refusal` or `toolUse`."""
        return self.generation.finish

    @property
    def complete(self) -> bool:
        """Whether `finish` is `stop`: the only normal completed output."""
        return self.generation.finish == "stop"

    @property
    def content(self) -> list[TextPart | ThinkingPart | ToolCallPart]:
        """The complete output parts, in order (text, thinking, toolCall)."""
        return list(self.generation.content)

    @property
    def text(self) -> str:
        """The text parts concatenated in order (thinking excluded)."""
        return "".join(p.text for p in self.generation.content if isinstance(p, TextPart))

    @property
    def thinking(self) -> str:
        """The display-only thinking parts concatenated in order."""
        return "".join(p.text for p in self.generation.content if isinstance(p, ThinkingPart))

    @property
    def tool_calls(self) -> list[ToolCallPart]:
        """The toolCall parts; non-empty exactly when `finish` is `toolUse`."""
        return [p for p in self.generation.content if isinstance(p, ToolCallPart)]

    @property
    def usage(self) -> Usage | None:
        """Provider-reported token counts, when sent (not a price)."""
        return self.generation.usage

    def json(self) -> dict[str, Any]:
        """`text` parsed as a JSON object (NAP-LLM, Generation: `format: json`).

        Raises `ProtocolError` when it is not one (the shell checks this for
        `format: json` requests, so this only fails for text requests).
        """
        try:
            value = read_json(self.text)
        except JsonTextError:
            raise ProtocolError("The answer is not a JSON object.") from None
        if not isinstance(value, dict):
            raise ProtocolError("The answer is not a JSON object.")
        return value

    def assistant_message(self) -> dict[str, Any]:
        """This turn as an assistant Message dict for the next request's history.

        Keeps text and toolCall parts (thinking is display-only and is not
        replayed, NAP-LLM, Part). Raises `ProtocolError` for a turn with no
        such part (nothing to replay).
        """
        parts = [
            p.model_dump(mode="json")
            for p in self.generation.content
            if isinstance(p, TextPart | ToolCallPart)
            and not (isinstance(p, TextPart) and not p.text)
        ]
        if not parts:
            raise ProtocolError("The answer has no content to continue the conversation with.")
        return {"role": "assistant", "content": parts}

    def __str__(self) -> str:
        return self.text


def _payload(message: dict[str, Any], key: str) -> Any:
    """The success payload `key` of a result, or raise its error."""
    if "error" in message:
        if key in message:
            raise ProtocolError("The shell sent a result with both a payload and an error.")
        raise error_from_record(message["error"])
    if key not in message:
        raise ProtocolError("The shell sent a result without its payload.")
    return message[key]


def read_model(message: dict[str, Any]) -> ModelRecord:
    """The Model of an `llm.select.result` / `llm.describe.result`; raises its error."""
    try:
        return ModelRecord.model_validate(_payload(message, "model"))
    except ValidationError:
        raise ProtocolError("The shell sent a Model record that is not valid.") from None


def read_generation(message: dict[str, Any]) -> Reply:
    """The `Reply` of an `llm.generate.result`; raises its error."""
    try:
        generation = Generation.model_validate(_payload(message, "result"))
    except ValidationError:
        raise ProtocolError("The shell sent a Generation record that is not valid.") from None
    return Reply(str(message["id"]), generation)


def read_cancelled(message: dict[str, Any]) -> bool:
    """`cancelled` of an `llm.cancel.result`; raises its error."""
    value = _payload(message, "cancelled")
    if not isinstance(value, bool):
        raise ProtocolError("The shell sent a cancel result that is not a boolean.")
    return value


def read_delta(message: dict[str, Any]) -> Delta | None:
    """The `records.Delta` of an `llm.delta` envelope; None when it is not one."""
    fields = {k: v for k, v in message.items() if k != "type"}
    try:
        return Delta.model_validate(fields)
    except ValidationError:
        return None
