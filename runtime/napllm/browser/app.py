"""The Pyodide edge: wires `napllm.shell.Shell` to the host page (web/).

Rules (DESIGN.md: the browser edge is thin)
- The page defines `window.napllmHost` (web/shell.js, its side of the
  contract) and calls `start()` once Pyodide and napllm are loaded.
  Everything crossing the bridge is JSON text, so JS `null` stays `None`
  and no JS object is held by Python (pitfalls: jsnull, proxies).
- This module is the only one (with `http_fetch.py` and the engine ports)
  that imports `js`/`pyodide`; every rule it relies on lives in the shell.
- Credentials are stored by the page in IndexedDB (shell origin) and held
  by the registry; they never reach a frame, an envelope, the inspector or
  an error (the page only ever receives `Connection.public_summary()`).
  Every log line of the page goes through `RedactingFormatter`, which
  removes each saved credential (a provider may echo one back).
- The product has no test mode: nothing here reads the page's query. A
  test build (`build.py build --with-test-hooks`) wraps `start` from a
  module that only that build contains.
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
from collections.abc import Callable
from typing import Any

from js import Object, napllmHost  # type: ignore[import-not-found]
from pydantic import ValidationError
from pyodide.ffi import create_proxy, to_js  # type: ignore[import-not-found]

from ..connections import (
    Connection,
    ConnectionRegistry,
    ConnectionSpec,
    UrlRefused,
    spec_error_text,
)
from ..discovery import Target, default_targets, discover, server_info
from ..errors import ProviderFailure
from ..jsontext import JsonTextError, read_json
from ..kinds import KindInfo, catalogue, route_for
from ..schema import JschonValidator, set_default_validator
from ..shell import (
    ChoiceRequest,
    ConsentDecision,
    Disclosure,
    Observer,
    Shell,
    ShellPolicy,
)
from ..wire import Unclonable, loads_strict
from .engines import register_engines
from .http_fetch import reaches_opaquely
from .providers import BrowserProviders, connection_from_spec, default_connections

log = logging.getLogger("napllm.browser")


class RedactingFormatter(logging.Formatter):
    """Formats log records with every saved credential replaced by `[redacted]`.

    A provider may echo a token in an error field that ends up in a log
    line's developer detail (or in a traceback); the page's console must
    never show it. `secrets` returns the current credentials (any length).
    """

    def __init__(self, secrets: Callable[[], list[str]]) -> None:
        super().__init__("%(name)s: %(levelname)s: %(message)s")
        self._secrets = secrets

    def format(self, record: logging.LogRecord) -> str:
        """The formatted record (traceback included), credentials removed."""
        return redact(super().format(record), self._secrets())


def redact(text: str, secrets: list[str]) -> str:
    """`text` with each non-empty string of `secrets` replaced by `[redacted]`."""
    for secret in sorted((s for s in secrets if s), key=len, reverse=True):
        text = text.replace(secret, "[redacted]")
    return text


def install_log_redaction(registry: ConnectionRegistry) -> logging.Handler:
    """Route every log record of the page (root logger) through `RedactingFormatter`."""

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


class BridgeTransport:
    """Delivers envelopes through `napllmHost.post` (JSON text)."""

    def send(self, endpoint_id: str, envelope: dict[str, Any]) -> None:
        """Post to the endpoint's frame; the page drops it if the frame is gone."""
        napllmHost.post(endpoint_id, json.dumps(envelope, ensure_ascii=False))


class DomChooser:
    """The page's `<dialog>` chooser; closed when the shell no longer needs it."""

    async def choose(self, request: ChoiceRequest) -> str | None:
        """Show the dialog; the chosen connection id or None."""
        token = "c-" + secrets.token_hex(8)
        try:
            payload = request.to_json() | {"endpointId": request.endpoint_id}
            answer = await napllmHost.openChooser(token, json.dumps(payload))
        except asyncio.CancelledError:
            napllmHost.closeDialog(token)
            raise
        return str(answer) if isinstance(answer, str) and answer else None


class DomConsent:
    """The page's `<dialog>` consent; closed when the shell no longer needs it."""

    async def ask(self, disclosure: Disclosure) -> ConsentDecision:
        """Show the dialog; Deny unless the page answered an explicit Allow."""
        token = "k-" + secrets.token_hex(8)
        try:
            payload = disclosure.to_json() | {"endpointId": disclosure.endpoint_id}
            answer = await napllmHost.openConsent(token, json.dumps(payload))
        except asyncio.CancelledError:
            napllmHost.closeDialog(token)
            raise
        try:
            data = read_json(str(answer))
        except ValueError:
            return ConsentDecision(allow=False)
        if not isinstance(data, dict):
            return ConsentDecision(allow=False)
        return ConsentDecision(
            allow=data.get("allow") is True, remember=data.get("remember") is True
        )


class BridgeObserver(Observer):
    """Forwards inspector records and user notices to the page."""

    def __init__(self, runtime: Runtime) -> None:
        self._runtime = runtime

    # Envelopes are recorded by the page itself, in (before `receive`) and
    # out (in `napllmHost.post`), so `envelope` keeps the no-op default.

    def dropped(self, endpoint_id: str, reason: str) -> None:
        """Shown in the inspector as a note, not as an envelope."""
        napllmHost.inspect(endpoint_id, "note", json.dumps({"dropped": reason}))

    def notice(self, level: str, text: str, connection_id: str | None = None) -> None:
        """A message for the user in the shell UI."""
        payload: dict[str, Any] = {"level": level, "text": text}
        if connection_id:
            payload["connectionId"] = connection_id
        napllmHost.notice(json.dumps(payload))

    def grants_changed(self) -> None:
        """Refresh the grants list in the connections panel."""
        self._runtime.publish_grants()


class Runtime:
    """The shell plus the page-facing API (`attachRuntime`).

    `providers` defaults to a fresh `BrowserProviders` (a test build passes
    its own subclass). `extra_kinds`: kinds published to the page beyond the
    product's (`kinds.KINDS`); `probe_targets`: the addresses "Look for
    running servers" asks (`discovery.default_targets()`); the test build
    sets both.
    """

    extra_kinds: tuple[KindInfo, ...] = ()

    def __init__(self, providers: BrowserProviders | None = None) -> None:
        self.registry = ConnectionRegistry()
        install_log_redaction(self.registry)
        self.providers = providers if providers is not None else BrowserProviders()
        register_engines(self.providers.engines)
        self.shell = Shell(
            self.registry,
            BridgeTransport(),
            DomChooser(),
            DomConsent(),
            self.providers.provider_for,
            policy=ShellPolicy(),
            observer=BridgeObserver(self),
        )
        self._proxies: list[Any] = []
        #: Stored entries this build could not read at the last load or sync.
        self.unreadable_stored = 0
        self._unreadable_ids: set[str] = set()
        # Saves and syncs run one at a time, so a sync never undoes a save in flight.
        self._storage_lock = asyncio.Lock()
        self.probe_targets: list[Target] = default_targets()

    # -- kinds and local servers -------------------------------------------------

    def publish_kinds(self) -> None:
        """Send the connection kinds (`kinds.catalogue`) to the page."""
        napllmHost.connectionKinds(json.dumps(catalogue(self.extra_kinds)))

    async def discover_servers(self, origin: str, kind: str, secret: str) -> str:
        """Look for model servers on this computer (the form's button; `discovery`).

        `origin`: the page's origin, named in the fixes; `kind`, `secret`:
        the form's kind and typed secret, which is sent only to servers of
        that kind. Returns JSON text `{"servers": [Finding.to_json()...]}`.
        """
        found = await discover(
            self.providers.http,
            self.probe_targets,
            origin=origin,
            reachable=reaches_opaquely,
            secret_for=lambda t: secret if secret and _server_kind(t) == kind else None,
        )
        return json.dumps({"servers": [f.to_json() for f in found]})

    # -- connections -----------------------------------------------------------

    def publish_connections(self) -> None:
        """Send the public summaries to the page."""
        summaries = [c.public_summary() for c in self.registry.all()]
        napllmHost.connectionsChanged(json.dumps(summaries))

    def publish_grants(self) -> None:
        """Send the standing grants to the page."""
        names = {c.id: c.name for c in self.registry.all()}
        grants = [g.to_json(names.get(g.connection_id, "")) for g in self.shell.grants()]
        napllmHost.grantsChanged(json.dumps(grants))

    @staticmethod
    def _stored_form(connection: Connection) -> dict[str, Any]:
        """A user connection as stored by the page (credential included, shell-only)."""
        secret = connection.credential.get_secret_value() if connection.credential else None
        return connection.model_dump(mode="json", by_alias=True) | {"credential": secret}

    async def persist(
        self, put: list[Connection] | None = None, delete: list[str] | None = None
    ) -> None:
        """Save only the named user connections via the page (never the whole list).

        `put`: connections to write, each replacing only its own record;
        `delete`: ids whose records are removed. Records of other
        connections, including the ones this build cannot read, are never
        touched (web/js/storage.js does each save as one IndexedDB
        transaction and tells the other tabs). Raises what the page raises
        when IndexedDB fails; nothing is then saved.
        """
        changes = {
            "put": [self._stored_form(c) for c in put or []],
            "delete": list(delete or []),
        }
        await napllmHost.saveConnections(json.dumps(changes))

    async def _read_stored(self) -> list[Connection]:
        """The stored user connections this build can read, oldest first.

        Entries it cannot read (unknown fields, another build's format,
        broken text) are counted in `unreadable_stored` and remembered by id
        so no new connection takes their id; they are never rewritten.
        """
        try:
            stored = read_json(str(await napllmHost.loadConnections()))
        except JsonTextError:
            stored = []
        readable: list[Connection] = []
        unreadable: set[str] = set()
        count = 0
        for raw in stored if isinstance(stored, list) else []:
            try:
                connection = Connection.model_validate(raw)
                if not connection.settings.get("userDefined"):
                    raise ValueError("not a user connection")
                # The route is derived, never trusted from storage (kinds.route_for).
                route = route_for(connection.kind, connection.settings)
                readable.append(connection.model_copy(update={"route": route}))
            except ValueError:
                count += 1
                if isinstance(raw, dict) and isinstance(raw.get("id"), str):
                    unreadable.add(raw["id"])
        self.unreadable_stored = count
        self._unreadable_ids = unreadable
        return readable

    async def load(self) -> None:
        """Built-in connections, then the user's stored ones."""
        for connection in await default_connections(self.providers):
            self.registry.add(connection)
        for connection in await self._read_stored():
            if self.registry.get(connection.id) is None:
                self.registry.add(connection)
            else:
                self.unreadable_stored += 1

    async def sync_stored(self) -> str:
        """Re-read the stored connections after another tab changed them.

        Adds the new ones, applies edits (their handles and grants become
        invalid) and removes the ones gone from storage, which cancels their
        running generations and expires their handles in this tab too
        (NAP-LLM: a removed connection invalidates its handles). Returns
        JSON text `{"unreadable": n}`: stored entries this build cannot read.
        """
        async with self._storage_lock:
            stored = {c.id: c for c in await self._read_stored()}
            for current in self.registry.all():
                if current.settings.get("userDefined") and current.id not in stored:
                    self.registry.remove(current.id)
            for cid, connection in stored.items():
                existing = self.registry.get(cid)
                if existing is None:
                    self.registry.add(connection)
                elif not existing.settings.get("userDefined"):
                    self.unreadable_stored += 1
                elif self._stored_form(existing) | {"revision": 0} != self._stored_form(
                    connection
                ) | {"revision": 0}:
                    changes = connection.model_dump(exclude={"id", "revision"})
                    changes["credential"] = connection.credential
                    self.registry.edit(cid, **changes)
        self.publish_connections()
        self.publish_grants()
        return json.dumps({"unreadable": self.unreadable_stored})

    def _new_id(self) -> str:
        while True:
            cid = "u-" + secrets.token_hex(6)
            if self.registry.get(cid) is None and cid not in self._unreadable_ids:
                return cid

    def _spec(self, text: str) -> ConnectionSpec:
        return ConnectionSpec.model_validate(read_json(text))

    async def add_connection(self, text: str) -> str:
        """Add a user connection from the form's JSON; returns its summary."""
        from ..providers.scripted import ScriptError

        spec = self._spec(text)
        try:
            connection = await connection_from_spec(spec, self._new_id(), self.providers)
        except ScriptError as exc:  # the developer's own script: say where it is wrong
            return json.dumps({"error": f"The script cannot be used: {exc}."})
        async with self._storage_lock:
            await self.persist(put=[connection])
            self.registry.add(connection)
        self.publish_connections()
        return json.dumps(connection.public_summary())

    async def edit_connection(self, cid: str, text: str) -> str:
        """Edit a user connection (its handles and grants become invalid)."""
        existing = self.registry.get(cid)
        if existing is None or not existing.settings.get("userDefined"):
            raise ValueError("only user connections can be edited")
        spec = self._spec(text)
        if spec.credential is None and existing.credential is not None:
            spec = spec.model_copy(update={"credential": existing.credential.get_secret_value()})
        from ..providers.scripted import ScriptError

        try:
            fresh = await connection_from_spec(spec, cid, self.providers)
        except ScriptError as exc:
            return json.dumps({"error": f"The script cannot be used: {exc}."})
        changes = fresh.model_dump(exclude={"id", "revision"})
        changes["credential"] = fresh.credential
        async with self._storage_lock:
            current = self.registry.get(cid)
            if current is None:
                raise ValueError("the connection was removed")
            stored = fresh.model_copy(update={"revision": current.revision + 1})
            await self.persist(put=[stored])
            edited = self.registry.edit(cid, **changes)
        self.publish_connections()
        return json.dumps(edited.public_summary())

    async def remove_connection(self, cid: str) -> None:
        """Remove a user connection (its handles and grants become invalid)."""
        existing = self.registry.get(cid)
        if existing is None or not existing.settings.get("userDefined"):
            raise ValueError("only user connections can be removed")
        async with self._storage_lock:
            await self.persist(delete=[cid])
            if self.registry.get(cid) is not None:
                self.registry.remove(cid)
        self.publish_connections()

    # -- page API --------------------------------------------------------------

    def receive(self, endpoint_id: str, wire_text: str) -> None:
        """One converted message from the page (web/js/wire.js)."""
        try:
            wire = read_json(str(wire_text))
        except ValueError:
            return
        if not isinstance(wire, dict):
            return
        message: object
        if "json" in wire and isinstance(wire["json"], str):
            try:
                message = loads_strict(wire["json"])
            except ValueError:
                message = Unclonable(None, None)
        else:
            kind = wire.get("type")
            rid = wire.get("id")
            message = Unclonable(
                kind if isinstance(kind, str) else None,
                rid if isinstance(rid, str) else None,
                too_large=wire.get("tooLarge") is True,
            )
        self.shell.receive(str(endpoint_id), message)

    def open_endpoint(self, identity_text: str) -> str:
        """Register a frame's document; returns its endpoint id."""
        from ..shell import NappletIdentity

        data = read_json(str(identity_text))
        domains = frozenset(d for d in data.get("domains", []) if isinstance(d, str))
        origin = data.get("origin")
        identity = NappletIdentity(
            str(data["name"]),
            str(data["sha256"]),
            domains,
            origin[:200] if isinstance(origin, str) else "",
        )
        return self.shell.open_endpoint(identity)

    def _proxy(self, fn: Any) -> Any:
        proxy = create_proxy(fn)
        self._proxies.append(proxy)  # page lifetime: kept, never destroyed
        return proxy

    def _form(self, coro_fn: Any) -> Any:
        """Wrap the form's add/edit: a refused field becomes `{"error": text}` (JSON).

        The text is one of napllm's fixed sentences (`spec_error_text`, a
        provider's `user_hint`); neither pydantic's text nor a provider's
        reply is ever shown, since both may repeat a URL or a token.
        """

        async def call(*args: str) -> str:
            try:
                result: str = await coro_fn(*args)
            except ValidationError as exc:
                return json.dumps({"error": spec_error_text(exc)})
            except UrlRefused as exc:
                return json.dumps({"error": str(exc)})
            except ProviderFailure as exc:
                hint = exc.user_hint or "The connection could not be reached."
                return json.dumps({"error": hint})
            return result

        return call

    def _async(self, coro_fn: Any) -> Any:
        """A JS-callable that returns a Promise of the coroutine's result."""

        def call(*args: Any) -> Any:
            return asyncio.ensure_future(coro_fn(*[str(a) for a in args]))

        return self._proxy(call)

    def api(self) -> Any:
        """The object handed to `napllmHost.attachRuntime`."""
        functions = {
            "openEndpoint": self._proxy(self.open_endpoint),
            "closeEndpoint": self._proxy(lambda eid: self.shell.close_endpoint(str(eid))),
            "receive": self._proxy(self.receive),
            "switchAccount": self._proxy(self._switch_account),
            "addConnection": self._async(self._form(self.add_connection)),
            "editConnection": self._async(self._form(self.edit_connection)),
            "removeConnection": self._async(self.remove_connection),
            "syncConnections": self._async(self.sync_stored),
            "discoverServers": self._async(self.discover_servers),
            "listConnections": self._proxy(
                lambda: json.dumps([c.public_summary() for c in self.registry.all()])
            ),
            "revokeGrant": self._proxy(lambda key: self.shell.revoke_grant(str(key))),
            "listGrants": self._proxy(
                lambda: json.dumps([g.to_json("") for g in self.shell.grants()])
            ),
        }
        return to_js(functions, dict_converter=Object.fromEntries)

    def _switch_account(self, account: str) -> None:
        self.shell.switch_account(str(account))
        self.publish_grants()


def _server_kind(target: Target) -> str | None:
    info = server_info(target.server)
    return info.kind if info is not None else None


async def start(runtime: Runtime | None = None) -> Runtime:
    """Boot the runtime in the page and attach it to `napllmHost`.

    `runtime` defaults to a fresh `Runtime()`; it is loaded (connections)
    before it is attached.
    """
    set_default_validator(JschonValidator())
    napllmHost.bootProgress("Starting the runtime", 0.9)
    if runtime is None:
        runtime = Runtime()
    await runtime.load()
    runtime.publish_kinds()
    napllmHost.attachRuntime(runtime.api())
    runtime.publish_connections()
    runtime.publish_grants()
    napllmHost.bootProgress("Ready", 1.0)
    return runtime
