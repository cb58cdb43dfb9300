"""Log redaction for the page: no saved credential ever reaches the console.

Rules
- Every log record of the page (root logger) is formatted by
  `RedactingFormatter`, which replaces each saved credential with
  `[redacted]`, tracebacks included: a provider may echo a token back in an
  error field that ends up in a log line's developer detail.
- Installing twice replaces the earlier handler (one per page).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from ..connections import ConnectionRegistry


class RedactingFormatter(logging.Formatter):
    """Formats log records with every saved credential replaced by `[redacted]`.

    `secrets` returns the current credentials (any length); it is called for
    each record, so a credential saved later is redacted too.
    """

    def __init__(self, secrets: Callable[[], list[str]]) -> None:
        super().__init__("%(name)s: %(levelname)s: %(message)s")
        self._secrets = secrets

    def format(self, record: logging.LogRecord) -> str:
        """The formatted record (traceback included), credentials removed."""
        return redact(super().format(record), self._secrets())


def redact(text: str, secrets: list[str]) -> str:
    """`text` with each non-empty string of `secrets` replaced by `[redacted]` (longest first)."""
    for secret in sorted((s for s in secrets if s), key=len, reverse=True):
        text = text.replace(secret, "[redacted]")
    return text


def install_log_redaction(registry: ConnectionRegistry) -> logging.Handler:
    """Route every log record of the page (root logger) through `RedactingFormatter`.

    The credentials are those of `registry`'s connections at each record.
    Returns the installed handler.
    """

    def current() -> list[str]:
        return [c.credential.get_secret_value() for c in registry.all() if c.credential]

    handler = logging.StreamHandler()
    handler.setFormatter(RedactingFormatter(current))
    root = logging.getLogger()
    for old in list(root.handlers):
        if getattr(old, "napllm_redacting", False):
            root.removeHandler(old)
    handler.napllm_redacting = True  # type: ignore[attr-defined]
    root.addHandler(handler)
    return handler
