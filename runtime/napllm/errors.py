"""Typed NAP-LLM failures (NAP-LLM, Error Handling).

Rules
- Every failure a napplet can see is one of the eight codes below, carried by
  `NapError` inside the runtime and turned into an Error record
  (`{"code", "message"}`) on the wire.
- A message is a *safe* diagnostic: a fixed sentence chosen by the runtime.
  It never contains a provider body, a credential, a URL of a connection, a
  prompt or another endpoint's data. `NapError` therefore takes the message
  from `SAFE_MESSAGES` unless the caller passes one of its own, and callers
  only pass sentences they wrote themselves (for example naming a field of
  the napplet's own request).
- `ProviderFailure` is what providers raise. It keeps an optional `user_hint`
  for the shell's own UI (never sent to a napplet) and turns into
  `provider-error` (or the code it names) when it reaches the shell.
"""

from __future__ import annotations

from enum import StrEnum


class ErrorCode(StrEnum):
    """The stable failure categories of NAP-LLM, Error Handling."""

    UNSUPPORTED = "unsupported"
    INVALID_REQUEST = "invalid-request"
    SELECTION_EXPIRED = "selection-expired"
    USER_CANCELLED = "user-cancelled"
    CANCELLED = "cancelled"
    TIMEOUT = "timeout"
    QUOTA_EXCEEDED = "quota-exceeded"
    PROVIDER_ERROR = "provider-error"


SAFE_MESSAGES: dict[ErrorCode, str] = {
    ErrorCode.UNSUPPORTED: "The selected connection does not support this request.",
    ErrorCode.INVALID_REQUEST: "The request is malformed.",
    ErrorCode.SELECTION_EXPIRED: "The model selection is no longer valid; select again.",
    ErrorCode.USER_CANCELLED: "The user declined the request.",
    ErrorCode.CANCELLED: "Generation cancelled; provider charges may still apply.",
    ErrorCode.TIMEOUT: "Generation deadline reached; provider charges may still apply.",
    ErrorCode.QUOTA_EXCEEDED: "A runtime limit prevented the request.",
    ErrorCode.PROVIDER_ERROR: "The model provider failed or returned invalid output.",
}


class NapError(Exception):
    """A NAP-LLM failure with a stable `code` and a safe `message`.

    `code`: an `ErrorCode`; `message`: a runtime-written sentence (defaults to
    the code's `SAFE_MESSAGES` entry). Implements NAP-LLM, Error Handling.
    """

    def __init__(self, code: ErrorCode, message: str | None = None) -> None:
        self.code = code
        self.message = message if message is not None else SAFE_MESSAGES[code]
        super().__init__(f"{code.value}: {self.message}")

    def to_record(self) -> dict[str, str]:
        """The Error record: `{"code": <text>, "message": <text>}`."""
        return {"code": self.code.value, "message": self.message}


def invalid(message: str) -> NapError:
    """`invalid-request` with a runtime-written reason (never echoing input values)."""
    return NapError(ErrorCode.INVALID_REQUEST, message)


def unsupported(message: str) -> NapError:
    """`unsupported` with a runtime-written reason naming the missing capability."""
    return NapError(ErrorCode.UNSUPPORTED, message)


class ProviderFailure(Exception):
    """Raised by a provider when a submission fails.

    `code` is the NAP-LLM code the shell reports (normally `provider-error`;
    `unsupported` for LMSP `unsupported_capability`, `quota-exceeded` for a
    context window or rate limit). `user_hint` is shown in the shell's own UI
    only, for example "the service rejected the access token"; it must not
    contain the provider's body either. `detail` is kept for the developer
    log of the shell and is never put in an envelope. `safe_message`
    optionally replaces the code's fixed napplet-facing sentence; it must be
    written by napllm, never copied from a service.
    """

    def __init__(
        self,
        code: ErrorCode = ErrorCode.PROVIDER_ERROR,
        *,
        user_hint: str | None = None,
        detail: str | None = None,
        safe_message: str | None = None,
    ) -> None:
        self.code = code
        self.user_hint = user_hint
        self.detail = detail
        self.safe_message = safe_message
        super().__init__(code.value)

    def to_nap_error(self) -> NapError:
        """The napplet-facing error: the code with its safe message.

        `safe_message` must be a sentence written by napllm itself (never
        text from the service); without one, the code's fixed message is used.
        """
        return NapError(self.code, self.safe_message)
