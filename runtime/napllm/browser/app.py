"""The Pyodide edge: wires `napllm.shell.Shell` to the host page (web/).

The page (web/shell.js) defines `window.napllmHost` and calls `start()` once
Pyodide and napllm are loaded; `start` hands the page the `Runtime.api()`
object (`napllmHost.attachRuntime`). The parts, each in its own module:

- `bridge`: the shell's ports on the page (transport, chooser and consent
  dialogs, observer) and the intake of a frame's messages and identity.
- `stored`: the user's connections, saved in the page's store, kept in
  step with the registry (the connections form, other tabs).
- `logs`: every log line of the page is redacted of saved credentials.
- `providers` / `engines`: the provider of each connection kind.
- this module: `Runtime`, which assembles them and publishes the page API.

Rules (docs/design.md, "Style": a thin browser edge)
- Everything crossing the bridge is JSON text, so JS `null` stays `None`
  and no JS object is held by Python (docs/design.md, "Known behaviours":
  `jsnull`, proxies).
- These modules (with `http_fetch.py` and the engine ports) are the only
  ones that import `js`/`pyodide`; every rule they rely on lives in the shell.
- The product has no test mode: nothing here reads the page's query. A
  test build (`build.py build --with-test-hooks`) wraps `start` from a
  module that only that build contains.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

from js import Object, napllmHost  # type: ignore[import-not-found]
from pydantic import ValidationError
from pyodide.ffi import create_proxy, to_js  # type: ignore[import-not-found]

from ..connections import Connection, ConnectionRegistry, UrlRefused, spec_error_text
from ..discovery import Target, default_targets, discover, secret_goes_to
from ..errors import ProviderFailure
from ..grants import keys_of_napplet
from ..kinds import KindInfo, catalogue
from ..providers.scripted import ScriptedProvider
from ..schema import JschonValidator, set_default_validator
from ..shell import Shell, ShellPolicy
from .bridge import (
    BridgeObserver,
    BridgeTransport,
    DomChooser,
    DomConsent,
    identity_from_json,
    message_from_wire,
)
from .engines import register_engines
from .http_fetch import reaches_opaquely
from .logs import install_log_redaction
from .loop import install as install_ready_queue
from .providers import BrowserProviders
from .stored import ConnectionStore


def form_answer(
    coro_fn: Callable[..., Awaitable[str]],
) -> Callable[..., Awaitable[str]]:
    """Wrap the form's add/edit: a refused field becomes `{"error": text}` (JSON text).

    The text is one of napllm's fixed sentences (`spec_error_text`, a
    provider's `user_hint`); neither pydantic's text nor a provider's reply
    is ever shown, since both may repeat a URL or a token.
    """

    async def call(*args: str) -> str:
        try:
            return await coro_fn(*args)
        except ValidationError as exc:
            return json.dumps({"error": spec_error_text(exc)})
        except UrlRefused as exc:
            return json.dumps({"error": str(exc)})
        except ProviderFailure as exc:
            hint = exc.user_hint or "The connection could not be reached."
            return json.dumps({"error": hint})

    return call


class Runtime:
    """The shell, its ports on the page and the page-facing API (`attachRuntime`).

    `providers` defaults to a fresh `BrowserProviders` (a test build passes
    its own subclass). Attributes: `registry` (the connections), `shell`,
    `providers`, `store` (the user's saved connections). `extra_kinds`:
    kinds published to the page beyond the product's (`kinds.KINDS`);
    `probe_targets`: the addresses "Look for running servers" asks
    (`discovery.default_targets()`); the test build sets both.
    """

    extra_kinds: tuple[KindInfo, ...] = ()

    def __init__(self, providers: BrowserProviders | None = None) -> None:
        self.registry = ConnectionRegistry()
        install_log_redaction(self.registry)
        self.providers = providers if providers is not None else BrowserProviders()
        register_engines(self.providers.kinds)
        self.providers.on_script_request = self.publish_script_progress
        self.shell = Shell(
            self.registry,
            BridgeTransport(),
            DomChooser(),
            DomConsent(),
            self.providers.provider_for,
            policy=ShellPolicy(),
            observer=BridgeObserver(self.publish_grants),
        )
        self.store = ConnectionStore(
            self.registry, self.providers, self.publish_connections, self.publish_grants
        )
        self._proxies: list[Any] = []
        self.probe_targets: list[Target] = default_targets()

    # -- kinds and local servers -------------------------------------------------

    def publish_kinds(self) -> None:
        """Send the connection kinds (`kinds.catalogue`) to the page."""
        napllmHost.connectionKinds(json.dumps(catalogue(self.extra_kinds)))

    async def discover_servers(
        self, origin: str, kind: str, secret: str, base_url: str = ""
    ) -> str:
        """Look for model servers on this computer (the form's button; `discovery`).

        `origin`: the page's origin, named in the fixes; `kind`, `secret`,
        `base_url`: the form's kind, typed secret and base URL; the secret
        is sent only where `discovery.secret_goes_to` allows. Returns JSON
        text `{"servers": [Finding.to_json()...]}`.
        """
        base_url = base_url if isinstance(base_url, str) else ""
        found = await discover(
            self.providers.http,
            self.probe_targets,
            origin=origin,
            reachable=reaches_opaquely,
            secret_for=lambda t: secret if secret and secret_goes_to(t, kind, base_url) else None,
        )
        return json.dumps({"servers": [f.to_json() for f in found]})

    # -- connections -----------------------------------------------------------

    async def load(self) -> None:
        """The built-in connections, then the user's stored ones."""
        await self.store.load()

    def publish_connections(self) -> None:
        """Send the public summaries of the connections to the page."""
        summaries = [c.public_summary() for c in self.registry.all()]
        napllmHost.connectionsChanged(json.dumps(summaries))

    @staticmethod
    def publish_script_progress(connection: Connection, provider: ScriptedProvider) -> None:
        """Show a scripted connection's requests so far in its entry (docs/napplets.md).

        Sends `napllmHost.scriptProgress` JSON text `{"connectionId",
        "revision", "requests", "stopped" (streams closed before their end),
        "nextTurn" (1-based, null when no turn is left), "turns"}`; no
        script value is sent.
        """
        progress = {
            "connectionId": connection.id,
            "revision": connection.revision,
            "requests": provider.submissions,
            "stopped": provider.stopped,
            "nextTurn": provider.next_turn,
            "turns": len(provider.script.turns),
        }
        napllmHost.scriptProgress(json.dumps(progress))

    def publish_grants(self) -> None:
        """Send the standing grants to the page."""
        names = {c.id: c.name for c in self.registry.all()}
        grants = [g.to_json(names.get(g.connection_id, "")) for g in self.shell.grants()]
        napllmHost.grantsChanged(json.dumps(grants))

    # -- endpoints and their messages ------------------------------------------

    def receive(self, endpoint_id: str, wire_text: str) -> None:
        """One message of a frame, as web/js/wire.js `toWireJson` converted it."""
        message = message_from_wire(wire_text)
        if message is not None:
            self.shell.receive(str(endpoint_id), message)

    def open_endpoint(self, identity_text: str) -> str:
        """Register a frame's document (`bridge.identity_from_json`); returns its endpoint id."""
        return self.shell.open_endpoint(identity_from_json(identity_text))

    def revoke_napplet_grants(self, identity_text: str) -> int:
        """Revoke every standing grant of one napplet identity (docs/design.md,
        "Napplet identity"): the page sends the same JSON text as to
        `open_endpoint` (`bridge.identity_from_json`), and the grants are
        matched by the identity they are keyed by (`grants.keys_of_napplet`).
        Returns how many were revoked.
        """
        napplet = identity_from_json(identity_text)
        keys = keys_of_napplet(self.shell.grants(), napplet)
        return sum(1 for key in keys if self.shell.revoke_grant(key))

    def switch_account(self, account: str) -> None:
        """Switch the user account (cancels work, expires handles; docs/design.md "Account")."""
        self.shell.switch_account(str(account))
        self.publish_grants()

    # -- the page API ----------------------------------------------------------

    def _proxy(self, fn: Any) -> Any:
        """`fn` callable from JS; the proxy lives as long as the page."""
        proxy = create_proxy(fn)
        self._proxies.append(proxy)  # page lifetime: kept, never destroyed
        return proxy

    def _async(self, coro_fn: Any) -> Any:
        """A JS-callable that returns a Promise of the coroutine's result."""

        def call(*args: Any) -> Any:
            return asyncio.ensure_future(coro_fn(*[str(a) for a in args]))

        return self._proxy(call)

    def api(self) -> Any:
        """The object handed to `napllmHost.attachRuntime` (its methods take and give JSON text)."""
        functions = {
            "openEndpoint": self._proxy(self.open_endpoint),
            "closeEndpoint": self._proxy(lambda eid: self.shell.close_endpoint(str(eid))),
            "receive": self._proxy(self.receive),
            "switchAccount": self._proxy(self.switch_account),
            "addConnection": self._async(form_answer(self.store.add)),
            "editConnection": self._async(form_answer(self.store.edit)),
            "removeConnection": self._async(self.store.remove),
            "syncConnections": self._async(self.store.sync),
            "discoverServers": self._async(self.discover_servers),
            "listConnections": self._proxy(
                lambda: json.dumps([c.public_summary() for c in self.registry.all()])
            ),
            "revokeGrant": self._proxy(lambda key: self.shell.revoke_grant(str(key))),
            "revokeNappletGrants": self._proxy(self.revoke_napplet_grants),
            "listGrants": self._proxy(
                lambda: json.dumps([g.to_json("") for g in self.shell.grants()])
            ),
        }
        return to_js(functions, dict_converter=Object.fromEntries)


async def start(runtime: Runtime | None = None) -> Runtime:
    """Boot the runtime in the page and attach it to `napllmHost`.

    `runtime` defaults to a fresh `Runtime()`; it is loaded (connections)
    before it is attached.
    """
    install_ready_queue(asyncio.get_running_loop())
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
