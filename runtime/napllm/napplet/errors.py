"""Typed failures of the napplet-side Python API (NAP-LLM, Error Handling).

Every failure the API raises is an `LlmError` carrying `code` and
`message`:

- One class per NAP-LLM error code (`ERROR_CLASSES`), raised when the
  shell answers with an Error record of that code, and also when the API
  refuses a request before sending it (the shell's own check, run in the
  napplet, names the same code and message the shell would have sent).
- `UnknownCodeError` for a code this version does not know (NAP-LLM:
  "Unknown error codes MUST be treated as failures").
- Four napplet-side failures whose `code` never appears on the wire:
  `OutputValidationError` (the answer does not match the requested model
  or schema), `IncompleteOutputError` (finish `length`/`refusal` where a
  complete answer is needed), `ToolRoundsExceededError` (the tool loop's
  round limit) and `ProtocolError` (a reply from the shell that does not
  match the NAP-LLM records).

Messages are the shell's safe sentences (never a provider body) or
sentences written by this package.
"""

from __future__ import annotations

from typing import Any, Protocol

from ..errors import ErrorCode


class Finished(Protocol):
    """What the output errors keep of a `replies.Reply` (this module imports
    no other module of the package)."""

    @property
    def finish(self) -> str: ...

    @property
    def text(self) -> str: ...


class LlmError(Exception):
    """Base of every failure of `napllm.napplet`.

    Attributes: `code` (text: a NAP-LLM error code, or one of the
    napplet-side codes of the subclasses below) and `message` (a safe,
    human-readable sentence).
    """

    code: str = "error"

    def __init__(self, message: str, *, code: str | None = None) -> None:
        if code is not None:
            self.code = code
        self.message = message
        super().__init__(f"{self.code}: {message}")


class UnsupportedError(LlmError):
    """`unsupported`: no compatible connection, or an input or format the
    selected connection cannot take (NAP-LLM, Error Handling)."""

    code = ErrorCode.UNSUPPORTED.value


class InvalidRequestError(LlmError):
    """`invalid-request`: a malformed request, refused by the shell's own
    record and conversation checks (raised before sending) or by the shell."""

    code = ErrorCode.INVALID_REQUEST.value


class SelectionExpiredError(LlmError):
    """`selection-expired`: the model handle is unknown, revoked or changed;
    call `select()` again."""

    code = ErrorCode.SELECTION_EXPIRED.value


class UserCancelledError(LlmError):
    """`user-cancelled`: the person declined the chooser or the disclosure."""

    code = ErrorCode.USER_CANCELLED.value


class GenerationCancelledError(LlmError):
    """`cancelled`: the generation was cancelled by the runtime (another
    `llm.cancel`, an account switch, a removed connection). A stream this
    napplet cancelled itself ends quietly instead."""

    code = ErrorCode.CANCELLED.value


class GenerationTimeoutError(LlmError, TimeoutError):
    """`timeout`: the runtime's generation deadline expired; provider effects
    (and charges) are uncertain, so it is never retried automatically."""

    code = ErrorCode.TIMEOUT.value


class QuotaExceededError(LlmError):
    """`quota-exceeded`: a size, concurrency, rate or usage limit of the runtime."""

    code = ErrorCode.QUOTA_EXCEEDED.value


class ProviderError(LlmError):
    """`provider-error`: the provider failed or returned invalid output."""

    code = ErrorCode.PROVIDER_ERROR.value


class UnknownCodeError(LlmError):
    """An Error record whose code this version does not know; still a failure."""


#: The class raised for each NAP-LLM error code.
ERROR_CLASSES: dict[str, type[LlmError]] = {
    ErrorCode.UNSUPPORTED.value: UnsupportedError,
    ErrorCode.INVALID_REQUEST.value: InvalidRequestError,
    ErrorCode.SELECTION_EXPIRED.value: SelectionExpiredError,
    ErrorCode.USER_CANCELLED.value: UserCancelledError,
    ErrorCode.CANCELLED.value: GenerationCancelledError,
    ErrorCode.TIMEOUT.value: GenerationTimeoutError,
    ErrorCode.QUOTA_EXCEEDED.value: QuotaExceededError,
    ErrorCode.PROVIDER_ERROR.value: ProviderError,
}


class ProtocolError(LlmError):
    """A reply from the shell that does not match the NAP-LLM records
    (napplet-side code `protocol`); never a silently wrong value."""

    code = "protocol"


class OutputValidationError(LlmError):
    """The answer is not what `response_model` / `schema` asked for
    (napplet-side code `invalid-output`).

    Attributes: `reply` (the `Reply` as received), `errors` (pydantic's error
    list without input values, or one entry for a JSON Schema mismatch).
    """

    code = "invalid-output"

    def __init__(self, message: str, reply: Finished, errors: list[dict[str, Any]]) -> None:
        super().__init__(message)
        self.reply = reply
        self.errors = errors


class IncompleteOutputError(LlmError):
    """Finish `length` or `refusal` where a complete answer was needed
    (structured output, the tool loop); napplet-side code `incomplete`.

    Attribute: `reply`, the partial `Reply` (NAP-LLM, Generation: only
    `stop` is normal completed output).
    """

    code = "incomplete"

    def __init__(self, reply: Finished) -> None:
        super().__init__(f"The model's answer ended with finish {reply.finish!r}.")
        self.reply = reply


class ToolRoundsExceededError(LlmError):
    """The model still asked for tools after `max_rounds` tool rounds
    (napplet-side code `tool-rounds-exceeded`); no tool of that turn ran.

    Attributes: `rounds` (the limit), `messages` (the conversation so far,
    as NAP-LLM Message dicts, to continue or show it).
    """

    code = "tool-rounds-exceeded"

    def __init__(self, rounds: int, messages: list[dict[str, Any]]) -> None:
        super().__init__(f"The model asked for more than {rounds} tool rounds.")
        self.rounds = rounds
        self.messages = messages


def error_from_record(record: object) -> LlmError:
    """The exception for an Error record `{"code": text, "message": text}`.

    A record that is not that shape is a `ProtocolError`; an unknown code
    is an `UnknownCodeError` carrying it.
    """
    if not isinstance(record, dict) or set(record) != {"code", "message"}:
        return ProtocolError("The shell sent an error that is not an Error record.")
    code, message = record["code"], record["message"]
    if not isinstance(code, str) or not isinstance(message, str):
        return ProtocolError("The shell sent an error that is not an Error record.")
    cls = ERROR_CLASSES.get(code)
    if cls is None:
        return UnknownCodeError(message, code=code[:64])
    return cls(message)
