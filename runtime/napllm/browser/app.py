"""The Pyodide edge: wires `napllm.shell.Shell` to the host page (web/).

Rules (DESIGN.md: the browser edge is thin)
- The page defines `window.napllmHost` (see web/js/bridge.js for its side of
  the contract) and calls `start()` once Pyodide and napllm are loaded.
  Everything crossing the bridge is JSON text, so JS `null` stays `None`
  and no JS object is held by Python (pitfalls: jsnull, proxies).
- This module is the only one (with `http_fetch.py` and the engine ports)
  that imports `js`/`pyodide`; every rule it relies on lives in the shell.
- Credentials are stored by the page in IndexedDB (shell origin) and held
  by the registry; they never reach a frame, an envelope, the inspector or
  an error (the page only ever receives `Connection.public_summary()`).
- Test mode (`?test=1`) adds fixture connections and exposes
  `window.napllmTest` to drive them; without it neither exists.
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
from typing import Any

from js import Object, location, napllmHost, window  # type: ignore[import-not-found]
from pyodide.ffi import create_proxy, to_js  # type: ignore[import-not-found]

from ..connections import Connection, ConnectionRegistry, ConnectionSpec
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
from .providers import BrowserProviders, connection_from_spec, default_connections, test_connections

log = logging.getLogger("napllm.browser")


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
            answer = await napllmHost.openChooser(token, json.dumps(request.to_json()))
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
            answer = await napllmHost.openConsent(token, json.dumps(disclosure.to_json()))
        except asyncio.CancelledError:
            napllmHost.closeDialog(token)
            raise
        try:
            data = json.loads(str(answer))
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
    """The shell plus the page-facing API (`attachRuntime`)."""

    def __init__(self, test_mode: bool) -> None:
        self.test_mode = test_mode
        self.registry = ConnectionRegistry()
        self.providers = BrowserProviders()
        register_engines(self.providers.engines, test_mode=test_mode)
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

    async def persist(self) -> None:
        """Store user connections (not built-in or test ones) via the page."""
        stored = [
            c.model_dump(mode="json", by_alias=True)
            | {"credential": c.credential.get_secret_value() if c.credential else None}
            for c in self.registry.all()
            if c.settings.get("userDefined")
        ]
        await napllmHost.saveConnections(json.dumps(stored))

    async def load(self) -> None:
        """Built-in connections, then the user's stored ones, then test ones."""
        for connection in await default_connections(self.providers):
            self.registry.add(connection)
        try:
            stored = json.loads(str(await napllmHost.loadConnections()))
        except ValueError:
            stored = []
        for raw in stored if isinstance(stored, list) else []:
            try:
                self.registry.add(Connection.model_validate(raw))
            except Exception:
                log.warning("a stored connection could not be read and was skipped")
        if self.test_mode:
            for connection in test_connections(self.providers):
                self.registry.add(connection)

    def _spec(self, text: str) -> ConnectionSpec:
        return ConnectionSpec.model_validate(json.loads(text))

    async def add_connection(self, text: str) -> str:
        """Add a user connection from the form's JSON; returns its summary."""
        spec = self._spec(text)
        connection = await connection_from_spec(spec, "u-" + secrets.token_hex(6), self.providers)
        self.registry.add(connection)
        await self.persist()
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
        fresh = await connection_from_spec(spec, cid, self.providers)
        changes = fresh.model_dump(exclude={"id", "revision"})
        changes["credential"] = fresh.credential
        edited = self.registry.edit(cid, **changes)
        await self.persist()
        self.publish_connections()
        return json.dumps(edited.public_summary())

    async def remove_connection(self, cid: str) -> None:
        """Remove a user connection (its handles and grants become invalid)."""
        existing = self.registry.get(cid)
        if existing is None or not existing.settings.get("userDefined"):
            raise ValueError("only user connections can be removed")
        self.registry.remove(cid)
        await self.persist()
        self.publish_connections()

    # -- page API --------------------------------------------------------------

    def receive(self, endpoint_id: str, wire_text: str) -> None:
        """One converted message from the page (see web/js/convert.js)."""
        try:
            wire = json.loads(str(wire_text))
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

        data = json.loads(str(identity_text))
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
            "addConnection": self._async(self.add_connection),
            "editConnection": self._async(self.edit_connection),
            "removeConnection": self._async(self.remove_connection),
            "listConnections": self._proxy(
                lambda: json.dumps([c.public_summary() for c in self.registry.all()])
            ),
            "revokeGrant": self._proxy(lambda key: self.shell.revoke_grant(str(key))),
            "listGrants": self._proxy(
                lambda: json.dumps([g.to_json("") for g in self.shell.grants()])
            ),
            "testMode": self.test_mode,
        }
        return to_js(functions, dict_converter=Object.fromEntries)

    def _switch_account(self, account: str) -> None:
        self.shell.switch_account(str(account))
        self.publish_grants()

    def test_api(self) -> Any:
        """`window.napllmTest` (test mode only): script and inspect fixtures."""

        def queue(cid: str, steps: str) -> None:
            self.providers.fixture(str(cid)).queue(json.loads(str(steps)))

        def stats(cid: str) -> str:
            fx = self.providers.fixture(str(cid))
            return json.dumps(
                {
                    "submissions": fx.submissions,
                    "closedEarly": fx.closed_early,
                    "queued": fx.queued,
                    "requests": [r.to_json() for r in fx.requests],
                }
            )

        def set_deadline(seconds: float) -> None:
            from dataclasses import replace

            self.shell.policy = replace(self.shell.policy, deadline_s=float(seconds))

        def edit(cid: str, name: str) -> None:
            self.registry.edit(str(cid), name=str(name))
            self.publish_connections()

        def remove(cid: str) -> None:
            self.registry.remove(str(cid))
            self.publish_connections()

        def clear(cid: str) -> int:
            return self.providers.fixture(str(cid)).clear()

        functions = {
            "queue": self._proxy(queue),
            "clear": self._proxy(clear),
            "stats": self._proxy(stats),
            "setDeadline": self._proxy(set_deadline),
            "editConnection": self._proxy(edit),
            "removeConnection": self._proxy(remove),
        }
        return to_js(functions, dict_converter=Object.fromEntries)


async def start() -> Runtime:
    """Boot the runtime in the page and attach it to `napllmHost`."""
    set_default_validator(JschonValidator())
    napllmHost.bootProgress("Starting the runtime", 0.9)
    test_mode = "test=1" in str(location.search)
    runtime = Runtime(test_mode)
    await runtime.load()
    if test_mode:
        window.napllmTest = runtime.test_api()
    napllmHost.attachRuntime(runtime.api())
    runtime.publish_connections()
    runtime.publish_grants()
    napllmHost.bootProgress("Ready", 1.0)
    return runtime
