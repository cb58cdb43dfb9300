"""Handles: what a napplet's `select` bound (NAP-LLM, API Surface: select;
Shell Behavior; docs/design.md, "Endpoint" and "Connection").

Rules
- A handle is random and opaque, and scoped to one endpoint, one account
  and the exact connection record the user picked: a connection edited, or
  removed and added again under the same id, is another record.
- A handle that is unknown, another endpoint's, from another account, for
  a connection edited, removed or no longer available, or of a closed
  endpoint is `selection-expired`, all alike, so a napplet learns nothing
  about handles that are not its own.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass

from .connection_records import Connection
from .connections import ConnectionRegistry
from .errors import ErrorCode, NapError


@dataclass
class Selection:
    """One handle's binding (module rules)."""

    endpoint_id: str
    account: str
    connection_id: str
    #: The exact record bound; an edit or a re-add under the id is another one.
    connection: Connection


class Selections:
    """The live handles of one shell (module rules)."""

    def __init__(self, connections: ConnectionRegistry) -> None:
        self._connections = connections
        #: handle -> its binding.
        self.handles: dict[str, Selection] = {}

    def bind(self, endpoint_id: str, account: str, connection: Connection) -> str:
        """A new handle for `connection` (the exact record picked)."""
        handle = "h-" + secrets.token_urlsafe(18)
        self.handles[handle] = Selection(endpoint_id, account, connection.id, connection)
        return handle

    def resolve(self, endpoint_id: str, account: str, handle: str) -> Connection:
        """The connection `handle` binds for this endpoint and account.

        Raises `NapError` `selection-expired` otherwise (module rules).
        """
        sel = self.handles.get(handle)
        connection = self._connections.get(sel.connection_id) if sel else None
        if (
            sel is None
            or connection is None
            or sel.endpoint_id != endpoint_id
            or sel.account != account
            or connection is not sel.connection
            or not connection.available
        ):
            raise NapError(ErrorCode.SELECTION_EXPIRED)
        return connection

    def forget_endpoint(self, endpoint_id: str) -> None:
        """Drop the handles of a closed endpoint."""
        for handle, sel in list(self.handles.items()):
            if sel.endpoint_id == endpoint_id:
                del self.handles[handle]

    def forget_connection(self, connection_id: str) -> None:
        """Drop the handles of a connection that was edited or removed."""
        for handle, sel in list(self.handles.items()):
            if sel.connection_id == connection_id:
                del self.handles[handle]

    def clear(self) -> None:
        """Drop every handle (the account changed)."""
        self.handles.clear()
