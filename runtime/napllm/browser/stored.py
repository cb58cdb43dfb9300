"""The user's connections: stored by the page, held by the registry.

`ConnectionStore` keeps the registry's user connections and the page's
IndexedDB store (web/js/storage.js, reached through `napllmHost`) in step:
it loads them at start, saves each add/edit/remove of the connections form,
and re-reads the store when another tab changed it.

Rules
- Credentials are stored by the page (shell origin) and held by the
  registry; the page only ever receives `Connection.public_summary()`, and
  nothing here returns a credential except `stored_form`, which goes only to
  the page's store.
- Each save names only the connections it changes, so entries of other
  connections, including the ones this build cannot read, are never
  rewritten. Saves and syncs run one at a time (a sync never undoes a save
  in flight).
- Editing or removing a connection invalidates its handles and grants (the
  registry's rule, NAP-LLM: a changed connection expires its handles).
"""

from __future__ import annotations

import asyncio
import json
import secrets
from collections.abc import Callable
from typing import Any

from js import napllmHost  # type: ignore[import-not-found]

from ..connections import Connection, ConnectionRegistry, ConnectionSpec
from ..jsontext import read_json, read_json_object
from .providers import BrowserProviders, connection_from_spec, default_connections

#: The longest stored record read (characters): the form's largest record
#: (a 1,000,000-character script, each character at most two once escaped
#: in the record's text, plus the other fields) fits with room to spare.
RECORD_MAX_CHARS = 4 * 1024 * 1024


def check_form_bounds(connection: Connection) -> None:
    """Refuse a stored connection the add form would not have made.

    The form's `ConnectionSpec` bounds its name and model lengths; a record
    read back must be within the same bounds. Raises `ValueError`.
    """
    for field in ("name", "model"):
        value = getattr(connection, field)
        bounds = ConnectionSpec.model_fields[field].metadata
        low = next((b.min_length for b in bounds if hasattr(b, "min_length")), 0)
        high = next((b.max_length for b in bounds if hasattr(b, "max_length")), None)
        if not isinstance(value, str) or len(value) < low or (high and len(value) > high):
            raise ValueError(f"the stored {field} is outside the form's bounds")


def stored_form(connection: Connection) -> dict[str, Any]:
    """A user connection as stored by the page (credential included, shell-only)."""
    secret = connection.credential.get_secret_value() if connection.credential else None
    return connection.model_dump(mode="json", by_alias=True) | {"credential": secret}


class ConnectionStore:
    """The user connections of `registry`, saved in the page's store.

    `providers` builds connections from the form's specs;
    `publish_connections` is called after every change of the list and
    `publish_grants` after a sync too (the page re-renders both).
    """

    def __init__(
        self,
        registry: ConnectionRegistry,
        providers: BrowserProviders,
        publish_connections: Callable[[], None],
        publish_grants: Callable[[], None],
    ) -> None:
        self.registry = registry
        self.providers = providers
        self._publish_connections = publish_connections
        self._publish_grants = publish_grants
        #: Stored entries this build could not read at the last load or sync.
        self.unreadable = 0
        self._unreadable_ids: set[str] = set()
        self._lock = asyncio.Lock()

    async def persist(
        self, put: list[Connection] | None = None, delete: list[str] | None = None
    ) -> None:
        """Save only the named user connections via the page (never the whole list).

        `put`: connections to write, each replacing only its own record;
        `delete`: ids whose records are removed. Records of other
        connections are never touched (web/js/storage.js does each save as
        one IndexedDB transaction and tells the other tabs). Raises what the
        page raises when IndexedDB fails; nothing is then saved.
        """
        changes = {"put": [stored_form(c) for c in put or []], "delete": list(delete or [])}
        await napllmHost.saveConnections(json.dumps(changes))

    async def read(self) -> list[Connection]:
        """The stored user connections this build can read, oldest first.

        The page hands back a JSON array of the records' texts (one per
        stored record, web/js/storage.js); each text is read on its own,
        within `RECORD_MAX_CHARS` and `read_json`'s other limits, so one bad
        record never hides the others. Entries it cannot read (unknown
        fields, another build's format, broken text, over a limit, outside
        the form's bounds) are counted in `unreadable` and remembered by id
        so no new connection takes their id; they are never rewritten.
        """
        # The outer array is the page's own JSON.stringify of strings (flat).
        texts = json.loads(str(await napllmHost.loadConnections()))
        readable: list[Connection] = []
        unreadable: set[str] = set()
        count = 0
        for text in texts if isinstance(texts, list) else []:
            raw: Any = None
            try:
                if not isinstance(text, str):
                    raise ValueError("not a record's text")
                raw = read_json_object(text, max_chars=RECORD_MAX_CHARS)
                connection = Connection.model_validate(raw)
                check_form_bounds(connection)
                if not connection.settings.get("userDefined"):
                    raise ValueError("not a user connection")
                # Checked as the form checks it; the route and what the kind
                # derives are derived again, never trusted from storage.
                readable.append(self.providers.kinds.kind(connection.kind).stored(connection))
            except ValueError:
                count += 1
                if isinstance(raw, dict) and isinstance(raw.get("id"), str):
                    unreadable.add(raw["id"])
        self.unreadable = count
        self._unreadable_ids = unreadable
        return readable

    async def load(self) -> None:
        """Built-in connections, then the user's stored ones."""
        for connection in await default_connections(self.providers):
            self.registry.add(connection)
        for connection in await self.read():
            if self.registry.get(connection.id) is None:
                self.registry.add(connection)
            else:
                self.unreadable += 1

    async def sync(self) -> str:
        """Re-read the stored connections after another tab changed them.

        Adds the new ones, applies edits (their handles and grants become
        invalid) and removes the ones gone from storage, which cancels their
        running generations and expires their handles in this tab too
        (NAP-LLM: a removed connection invalidates its handles). Returns
        JSON text `{"unreadable": n}`: stored entries this build cannot read.
        """
        async with self._lock:
            stored = {c.id: c for c in await self.read()}
            for current in self.registry.all():
                if current.settings.get("userDefined") and current.id not in stored:
                    self.registry.remove(current.id)
            for cid, connection in stored.items():
                existing = self.registry.get(cid)
                if existing is None:
                    self.registry.add(connection)
                elif not existing.settings.get("userDefined"):
                    self.unreadable += 1
                elif stored_form(existing) | {"revision": 0} != stored_form(connection) | {
                    "revision": 0
                }:
                    changes = connection.model_dump(exclude={"id", "revision"})
                    changes["credential"] = connection.credential
                    self.registry.edit(cid, **changes)
        self._publish_connections()
        self._publish_grants()
        return json.dumps({"unreadable": self.unreadable})

    def _new_id(self) -> str:
        while True:
            cid = "u-" + secrets.token_hex(6)
            if self.registry.get(cid) is None and cid not in self._unreadable_ids:
                return cid

    async def add(self, text: str) -> str:
        """Add a user connection from the form's JSON; returns its summary (JSON text).

        `text`: a `ConnectionSpec`. Raises pydantic's `ValidationError`,
        `UrlRefused` or `ProviderFailure` for a refused spec; a script the
        scripted kind cannot use gives `{"error": text}` naming where.
        """
        from ..providers.scripted import ScriptError

        spec = ConnectionSpec.model_validate(read_json(text))
        try:
            connection = await connection_from_spec(spec, self._new_id(), self.providers)
        except ScriptError as exc:  # the developer's own script: say where it is wrong
            return json.dumps({"error": f"The script cannot be used: {exc}."})
        async with self._lock:
            await self.persist(put=[connection])
            self.registry.add(connection)
        self._publish_connections()
        return json.dumps(connection.public_summary())

    async def edit(self, cid: str, text: str) -> str:
        """Edit user connection `cid` from the form's JSON; returns its summary (JSON text).

        Its handles and grants become invalid. A spec without a credential
        keeps the stored one. Raises `ValueError` for a connection that is
        not the user's (or was removed meanwhile), else as `add`.
        """
        existing = self.registry.get(cid)
        if existing is None or not existing.settings.get("userDefined"):
            raise ValueError("only user connections can be edited")
        spec = ConnectionSpec.model_validate(read_json(text))
        if spec.credential is None and existing.credential is not None:
            spec = spec.model_copy(update={"credential": existing.credential.get_secret_value()})
        from ..providers.scripted import ScriptError

        try:
            fresh = await connection_from_spec(spec, cid, self.providers)
        except ScriptError as exc:
            return json.dumps({"error": f"The script cannot be used: {exc}."})
        changes = fresh.model_dump(exclude={"id", "revision"})
        changes["credential"] = fresh.credential
        async with self._lock:
            current = self.registry.get(cid)
            if current is None:
                raise ValueError("the connection was removed")
            stored = fresh.model_copy(update={"revision": current.revision + 1})
            await self.persist(put=[stored])
            edited = self.registry.edit(cid, **changes)
        self._publish_connections()
        return json.dumps(edited.public_summary())

    async def remove(self, cid: str) -> None:
        """Remove user connection `cid` (its handles and grants become invalid).

        Raises `ValueError` for a connection that is not the user's.
        """
        existing = self.registry.get(cid)
        if existing is None or not existing.settings.get("userDefined"):
            raise ValueError("only user connections can be removed")
        async with self._lock:
            await self.persist(delete=[cid])
            if self.registry.get(cid) is not None:
                self.registry.remove(cid)
        self._publish_connections()
