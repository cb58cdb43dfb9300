"""Test hooks of the shell: present only in the test build (``dist-test/``).

``python3 build.py build --with-test-hooks`` copies this module to
``dist-test/testhooks/`` and replaces ``js/boot-runtime.js`` with
``tests/hooks/boot-runtime.js``, which writes this file into Pyodide and
calls `start` instead of ``napllm.browser.app.start`` when the page's query
has ``test=1``. That script's `testMode` is the one rule deciding test mode
(the query parsed, not matched as a substring); this module never decides
it again. The product ``dist/`` contains none of it.

What it adds to the runtime
- Fixture connections (`fx-full`, `fx-text`, `fx-json`, `fx-auto`,
  `fx-reasoning`, `fx-paid`) backed by `FixtureProvider`.
- ``window.napllmTest``: ``queue(cid, stepsJson)``, ``stats(cid)`` (JSON
  text: submissions, closedEarly, queued, requests), ``setDeadline(seconds)``,
  ``editConnection(cid, name)``,
  ``removeConnection(cid)``, ``restoreConnection(cid)``,
  ``recodeNextError(code)`` (the next error record sent gets `code`),
  ``holdChooserUpdates(on)`` (while on, the shell's refreshes of an open
  chooser wait; off sends the waiting ones).
- ``engineDelayMs=N`` (0..10000) in the query: every engine hands its chunks
  over N ms apart, so cancellation is testable with a fast model.
- ``probe=SERVER@PORT,...`` in the query (SERVER one of
  ``napllm.discovery.SERVERS``): "Look for running servers" asks these
  addresses on 127.0.0.1 instead of the usual ports, so a test's own servers
  are found.
- The ``fixture`` kind is added to the published kinds.

Why these remain (a test that needs only deterministic answers uses the
product's scripted connection instead, through the connections form:
tests/browser/shellpage.py `scripted_connection`; its entry counts requests
received and streams stopped before their end)
- `queue` takes raw LMSP event sequences, hostile ones included (malformed
  events, events out of order, a provider that raises something other than
  a provider failure); a script is a list of well-formed turns by design.
- `stats` returns the LMSP request the provider received (what the runtime
  made of the napplet's request); no product feature shows it, since it may
  hold the user's conversation.
- `setDeadline` shortens the runtime's generation deadline (300 s) to test
  its expiry; the deadline is not a setting of the product.
- `editConnection`, `removeConnection` and `restoreConnection` change a
  built-in (non-user) connection; the product only edits or removes
  connections the user made.
- `recodeNextError` gives one real answer an error code the binding cannot
  know, to test the binding's rejection (NAP-LLM E2); the runtime only sends
  codes the spec names.
- `holdChooserUpdates` makes the page show an older candidate list than
  the runtime offers, as when a click is made before a refresh arrives;
  the product's refresh is immediate, so the race cannot be timed without it.
- Fixture connections with a fixed set of capabilities (``fx-auto``: tools
  with "auto"/"none" only; ``fx-reasoning``: opaque reasoning state;
  ``fx-paid``: may charge) declare what a script's ``capabilities`` cannot.
- ``engineDelayMs`` slows a real engine (llama.cpp, WebLLM, ONNX) so its
  cancellation can be observed; a script only paces its own chunks.
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any
from urllib.parse import parse_qs

from js import Object, location, window  # type: ignore[import-not-found]
from pyodide.ffi import to_js  # type: ignore[import-not-found]

from napllm.browser.app import Runtime
from napllm.browser.app import start as start_product
from napllm.browser.providers import BrowserProviders
from napllm.connections import Capabilities, Connection
from napllm.discovery import Target, server_info
from napllm.kinds import KindInfo
from napllm.providers.base import Provider
from napllm.providers.fixture import FixtureProvider


def query() -> dict[str, list[str]]:
    """The page's query parameters (``urllib.parse.parse_qs``)."""
    return parse_qs(str(location.search).removeprefix("?"))


def engine_delay_ms() -> int:
    """``engineDelayMs`` from the query, clamped to 0..10000 (0 when absent or bad)."""
    try:
        value = int(query().get("engineDelayMs", ["0"])[0])
    except ValueError:
        return 0
    return max(0, min(value, 10_000))


#: The fixture connections' kind, published to the page in the test build only.
FIXTURE_KIND = KindInfo(
    kind="fixture",
    label="Test fixture",
    summary="Answers queued by a test; no model, nothing leaves the page.",
    test_only=True,
)
FIXTURE_ROUTE = "This page (test fixture: no model, nothing leaves the page)"


def probe_targets() -> list[Target] | None:
    """``probe`` from the query as discovery targets, or None when absent."""
    raw = query().get("probe")
    if not raw:
        return None
    targets = []
    for item in raw[0].split(","):
        server, _, port = item.partition("@")
        if server_info(server) is not None and port.isdigit():
            targets.append(Target(server, "127.0.0.1", int(port)))
    return targets


class FixtureKind:
    """The test build's connection kind: a fixture provider per connection id."""

    info = FIXTURE_KIND

    def __init__(self) -> None:
        self.fixtures: dict[str, FixtureProvider] = {}

    async def add(self, spec: Any, cid: str) -> Connection:
        """Never: the form does not offer this kind."""
        raise ValueError("fixture connections are not added from the form")

    def provider(self, connection: Connection) -> Provider:
        """The connection's fixture (KeyError if none)."""
        return self.fixtures[connection.id]

    async def default_connections(self) -> list[Connection]:
        """None: `test_connections` adds them after the product's."""
        return []

    def route(self, settings: dict[str, Any]) -> str:
        """`FIXTURE_ROUTE`."""
        return FIXTURE_ROUTE


class TestProviders(BrowserProviders):
    """`BrowserProviders` plus the fixture kind (fixture providers kept by connection id)."""

    def __init__(self) -> None:
        super().__init__()
        self.fixture_kind = FixtureKind()
        self.fixtures = self.fixture_kind.fixtures
        self.kinds.register(self.fixture_kind)

    def fixture(self, cid: str) -> FixtureProvider:
        """The fixture provider of test connection `cid` (KeyError if none)."""
        return self.fixtures[cid]


def test_connections(providers: TestProviders) -> list[Connection]:
    """The fixture connections (see the module docstring)."""
    full = Capabilities(
        images=True,
        images_in_tool_results=True,
        json_output=True,
        tools=True,
        tool_choice_modes=("auto", "none", "required", "tool"),
    )
    auto = Capabilities(tools=True, tool_choice_modes=("auto", "none"))
    specs: list[tuple[str, str, str, Capabilities, bool]] = [
        ("fx-full", "Fixture (all capabilities)", "fixture-full", full, False),
        ("fx-text", "Fixture (text only)", "fixture-text", Capabilities(), False),
        ("fx-json", "Fixture (JSON only)", "fixture-json", Capabilities(json_output=True), False),
        ("fx-auto", "Fixture (tools, auto/none)", "fixture-auto", auto, False),
        (
            "fx-reasoning",
            "Fixture (opaque reasoning)",
            "fixture-reasoning",
            Capabilities(
                tools=True, tool_choice_modes=("auto", "none"), requires_reasoning_state=True
            ),
            False,
        ),
        ("fx-paid", "Fixture (may charge)", "fixture-paid", full, True),
    ]
    route = FIXTURE_ROUTE
    connections = []
    for cid, name, model, caps, charges in specs:
        providers.fixtures[cid] = FixtureProvider()
        connections.append(
            Connection(
                id=cid,
                name=name,
                kind="fixture",
                model=model,
                route=route,
                capabilities=caps,
                charges=charges,
            )
        )
    return connections


class RecodingTransport:
    """The shell's transport, able to give the next error record another code.

    The runtime itself only ever sends NAP-LLM's codes; a test of the
    binding's rule that an unknown code is a failure (NAP-LLM, Error
    Handling) re-codes one real answer in transit with `recode_next`.
    """

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.next_code: str | None = None

    def recode_next(self, code: str) -> None:
        """Give the next envelope with an `error` record the code `code`."""
        self.next_code = code

    def send(self, endpoint_id: str, envelope: dict[str, Any]) -> None:
        """Send `envelope`, re-coded if one is pending and it is an error."""
        error = envelope.get("error")
        if self.next_code is not None and isinstance(error, dict):
            envelope = {**envelope, "error": {**error, "code": self.next_code}}
            self.next_code = None
        self.inner.send(endpoint_id, envelope)


class HeldRefreshChooser:
    """The shell's chooser, whose `refresh` calls can be held back (`hold`)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.hold = False
        self.held: list[tuple[Any, Any]] = []

    async def choose(self, request: Any) -> Any:
        """The inner chooser's pick."""
        return await self.inner.choose(request)

    def refresh(self, request: Any, updated: Any) -> None:
        """Refresh now, or later when held."""
        if self.hold:
            self.held.append((request, updated))
        else:
            self.inner.refresh(request, updated)

    def set_hold(self, on: bool) -> None:
        """Hold refreshes (on), or send the held ones and stop holding (off)."""
        self.hold = bool(on)
        if not self.hold:
            held, self.held = self.held, []
            for request, updated in held:
                self.inner.refresh(request, updated)


class TestRuntime(Runtime):
    """The product runtime with fixture connections and ``window.napllmTest``."""

    extra_kinds = (FIXTURE_KIND,)

    def __init__(self) -> None:
        self.test_providers = TestProviders()
        super().__init__(self.test_providers)
        self.transport = RecodingTransport(self.shell._transport)
        self.shell._transport = self.transport
        self.chooser = HeldRefreshChooser(self.shell._chooser)
        self.shell._chooser = self.chooser
        targets = probe_targets()
        if targets is not None:
            self.probe_targets = targets
        delay = engine_delay_ms()
        for engine in self.providers.engines.values():
            engine.delay_ms = delay

    async def load(self) -> None:
        """The product's connections, then the fixture connections."""
        await super().load()
        self.fixture_connections = {c.id: c for c in test_connections(self.test_providers)}
        for connection in self.fixture_connections.values():
            self.registry.add(connection)

    def test_api(self) -> Any:
        """The object set as ``window.napllmTest`` (see the module docstring)."""
        fixtures = self.test_providers

        def queue(cid: str, steps: str) -> None:
            fixtures.fixture(str(cid)).queue(json.loads(str(steps)))

        def stats(cid: str) -> str:
            fx = fixtures.fixture(str(cid))
            return json.dumps(
                {
                    "submissions": fx.submissions,
                    "closedEarly": fx.closed_early,
                    "queued": fx.queued,
                    "requests": [r.to_json() for r in fx.requests],
                }
            )

        def set_deadline(seconds: float) -> None:
            self.shell.policy = replace(self.shell.policy, deadline_s=float(seconds))

        def edit(cid: str, name: str) -> None:
            self.registry.edit(str(cid), name=str(name))
            self.publish_connections()

        def remove(cid: str) -> None:
            self.registry.remove(str(cid))
            self.publish_connections()

        def restore(cid: str) -> None:
            """Add fixture connection `cid` back as it was at load (after `remove`)."""
            if self.registry.get(str(cid)) is None:
                self.registry.add(self.fixture_connections[str(cid)])
                self.publish_connections()

        functions = {
            "queue": self._proxy(queue),
            "stats": self._proxy(stats),
            "setDeadline": self._proxy(set_deadline),
            "editConnection": self._proxy(edit),
            "removeConnection": self._proxy(remove),
            "restoreConnection": self._proxy(restore),
            "recodeNextError": self._proxy(lambda c: self.transport.recode_next(str(c))),
            "holdChooserUpdates": self._proxy(lambda on: self.chooser.set_hold(bool(on))),
        }
        return to_js(functions, dict_converter=Object.fromEntries)


async def start() -> Runtime:
    """Start the runtime with the hooks (boot-runtime.js calls this only in test mode)."""
    runtime = TestRuntime()
    window.napllmTest = runtime.test_api()
    await start_product(runtime)
    return runtime
