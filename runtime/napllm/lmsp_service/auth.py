"""Bearer-token access to the LMSP service (docs/lmsp.md, "Authentication and scopes").

Rules
- One bearer token per installation, made with `secrets.token_urlsafe` on the
  first start and kept in a file readable by its owner only (mode 0600, in a
  0700 directory): `--token-file`, else `$XDG_CONFIG_HOME/napllm/lmsp-token`,
  else `~/.config/napllm/lmsp-token`. The token is printed once, when it is
  created; later starts only name the file.
- A token file that others may read or write is refused rather than used.
- Every request under `/lmsp/v1/` must carry `Authorization: Bearer <token>`;
  the comparison is constant-time (`hmac.compare_digest`). A missing or wrong
  token is a 401 `unauthorized` problem with `WWW-Authenticate: Bearer`.
- The token grants every scope of the service except `tools:execute`
  (LMSP 1.0, 6.5 and 10.3): this service never executes tools.
"""

from __future__ import annotations

import hmac
import os
import secrets
import stat
from pathlib import Path

from .problems import ProblemError

TOKEN_BYTES = 32
GRANTED_SCOPES = ("models:read", "responses:create", "responses:read", "tasks:create", "tasks:read")


class TokenFileError(Exception):
    """The token file cannot be used (unsafe permissions, unreadable, empty)."""


def default_token_path() -> Path:
    """`$XDG_CONFIG_HOME/napllm/lmsp-token`, or `~/.config/napllm/lmsp-token`."""
    base = os.environ.get("XDG_CONFIG_HOME")
    root = Path(base) if base else Path.home() / ".config"
    return root / "napllm" / "lmsp-token"


def load_or_create_token(path: Path) -> tuple[str, bool]:
    """Read the token stored at `path`, creating it (mode 0600) when absent.

    Returns `(token, created)`. Raises `TokenFileError` when the file is
    accessible to others than its owner, or is empty or unreadable.
    """
    if not path.exists():
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        token = secrets.token_urlsafe(TOKEN_BYTES)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            # Another process created it between the check and the open.
            return load_or_create_token(path)
        with os.fdopen(fd, "w", encoding="ascii") as handle:
            handle.write(token + "\n")
        return token, True
    mode = path.stat().st_mode
    if not stat.S_ISREG(mode):
        raise TokenFileError("the token path is not a regular file")
    if mode & 0o077:
        raise TokenFileError("the token file is accessible to other users; make it mode 0600")
    try:
        token = path.read_text(encoding="ascii").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise TokenFileError("the token file cannot be read") from exc
    if not token:
        raise TokenFileError("the token file is empty")
    return token, False


class BearerAuth:
    """Checks the `Authorization` header against the service token."""

    def __init__(self, token: str) -> None:
        self._expected = token.encode("utf-8")

    def check(self, authorization: str | None) -> None:
        """Raise a 401 `ProblemError` unless `authorization` is `Bearer <token>`."""
        presented = b""
        if authorization is not None:
            scheme, _, credentials = authorization.partition(" ")
            if scheme.lower() == "bearer":
                presented = credentials.strip().encode("utf-8", "replace")
        if not hmac.compare_digest(presented, self._expected):
            raise ProblemError("unauthorized", headers={"WWW-Authenticate": "Bearer"})
