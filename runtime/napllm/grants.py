"""Standing consent grants (docs/design.md, "Consent").

Rules (NAP-LLM, Shell Behavior: consent before every submission)
- A grant is opt-in ("remember" in the consent dialog) and covers exactly
  one napplet identity (name and sha256 of its bytes), one connection and
  one account; a changed napplet, another connection or another account is
  not covered.
- It lasts until the user revokes it, the connection is edited or removed,
  or the page closes (nothing is stored).
- Every change is reported once (`on_change`), so the page's list of grants
  stays current.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from .shell_ports import Grant, NappletIdentity


def grant_key(napplet: NappletIdentity, connection_id: str, account: str) -> str:
    """The key of the grant for this napplet, connection and account."""
    return f"{account}\x1f{napplet.name}\x1f{napplet.sha256}\x1f{connection_id}"


def keys_of_napplet(grants: Iterable[Grant], napplet: NappletIdentity) -> list[str]:
    """The keys of the grants in `grants` that cover `napplet`, in any account
    and for any connection: those whose key `grant_key` makes for this exact
    identity (name and the full sha256), never a shortened hash or a label.
    """
    return [g.key for g in grants if g.key == grant_key(napplet, g.connection_id, g.account)]


class Grants:
    """The standing grants of one shell (module rules)."""

    def __init__(self, on_change: Callable[[], None]) -> None:
        self._grants: dict[str, Grant] = {}
        self._on_change = on_change

    def covers(self, napplet: NappletIdentity, connection_id: str, account: str) -> bool:
        """Whether a grant stands for exactly this napplet, connection and account."""
        return grant_key(napplet, connection_id, account) in self._grants

    def remember(self, napplet: NappletIdentity, connection_id: str, account: str) -> None:
        """Grant standing consent (the user chose "remember")."""
        key = grant_key(napplet, connection_id, account)
        self._grants[key] = Grant(key, napplet, connection_id, account)
        self._on_change()

    def all(self) -> list[Grant]:
        """Every standing grant, oldest first."""
        return list(self._grants.values())

    def revoke(self, key: str) -> bool:
        """Remove the grant `key`; True if it existed."""
        removed = self._grants.pop(key, None) is not None
        if removed:
            self._on_change()
        return removed

    def forget_connection(self, connection_id: str) -> None:
        """Remove every grant for a connection that was edited or removed."""
        keys = [k for k, g in self._grants.items() if g.connection_id == connection_id]
        for key in keys:
            del self._grants[key]
        if keys:
            self._on_change()
