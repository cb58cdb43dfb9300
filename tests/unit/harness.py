"""A CPython harness around `napllm.shell.Shell` for unit and conformance tests.

`Harness` wires the shell to recording ports: a transport that keeps every
envelope per endpoint, a chooser and a consent dialog whose answers the test
scripts (or holds open until released), a fixture provider per connection,
and a manual clock for deadlines and delta coalescing.
"""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from fixtures import user
from napllm.connection_records import Capabilities, Connection
from napllm.connections import ConnectionRegistry
from napllm.providers.fixture import FixtureProvider
from napllm.shell import (
    ChoicePick,
    ChoiceRequest,
    ConsentDecision,
    Disclosure,
    NappletIdentity,
    Observer,
    Shell,
    ShellPolicy,
)

#: The route of the fixture connections (a test-only kind, not in napllm.kinds).
FIXTURE_ROUTE = "This page (test fixture: no model, nothing leaves the page)"

FULL_CAPS = Capabilities(
    images=True,
    images_in_tool_results=True,
    json_output=True,
    tools=True,
    tool_choice_modes=("auto", "none", "required", "tool"),
)
PNG = base64.b64encode(b"\x89PNG\r\n\x1a\n" + bytes(16)).decode()


class Transport:
    """Records envelopes per endpoint, in order."""

    def __init__(self) -> None:
        self.sent: dict[str, list[dict[str, Any]]] = {}

    def send(self, endpoint_id: str, envelope: dict[str, Any]) -> None:
        self.sent.setdefault(endpoint_id, []).append(envelope)


class Chooser:
    """Answers with `answer(request)`, or waits for `release` when `hold` is set.

    The pick names the revision of the list this chooser shows: the one it
    was asked with, or the latest `refresh` of a subclass that has one
    (`shown_revision`).
    """

    def __init__(self) -> None:
        self.answer: Callable[[ChoiceRequest], str | None] = lambda r: r.candidates[0].id
        self.requests: list[ChoiceRequest] = []
        self.hold = False
        self.cancelled = 0
        self.shown_revision = 0
        self._gate = asyncio.Event()

    def release(self) -> None:
        self._gate.set()

    async def choose(self, request: ChoiceRequest) -> ChoicePick | None:
        self.requests.append(request)
        self.shown_revision = request.revision
        try:
            if self.hold:
                await self._gate.wait()
            chosen = self.answer(request)
            return None if chosen is None else ChoicePick(chosen, self.shown_revision)
        except asyncio.CancelledError:
            self.cancelled += 1
            raise


class Consent:
    """Answers `decision`, or waits for `release` when `hold` is set."""

    def __init__(self) -> None:
        self.decision = ConsentDecision(allow=True)
        self.asked: list[Disclosure] = []
        self.hold = False
        self.cancelled = 0
        self._gate = asyncio.Event()

    def release(self) -> None:
        self._gate.set()

    async def ask(self, disclosure: Disclosure) -> ConsentDecision:
        self.asked.append(disclosure)
        try:
            if self.hold:
                await self._gate.wait()
            return self.decision
        except asyncio.CancelledError:
            self.cancelled += 1
            raise


class Recorder(Observer):
    """Keeps notices and drops for assertions."""

    def __init__(self) -> None:
        self.notices: list[tuple[str, str, str | None]] = []
        self.drops: list[tuple[str, str]] = []
        self.submissions: list[tuple[str, str]] = []

    def notice(self, level: str, text: str, connection_id: str | None = None) -> None:
        self.notices.append((level, text, connection_id))

    def dropped(self, endpoint_id: str, reason: str) -> None:
        self.drops.append((endpoint_id, reason))

    def submitted(self, endpoint_id: str, connection_id: str) -> None:
        self.submissions.append((endpoint_id, connection_id))


class ManualClock:
    """A `Clock` whose timers fire only when the test advances time."""

    def __init__(self) -> None:
        self.now = 0.0
        self._timers: list[tuple[float, int, Callable[[], None], list[bool]]] = []
        self._serial = 0

    def call_later(self, delay: float, callback: Callable[[], None]) -> Any:
        cancelled = [False]
        self._serial += 1
        self._timers.append((self.now + delay, self._serial, callback, cancelled))

        class Handle:
            def cancel(self) -> None:
                cancelled[0] = True

        return Handle()

    def advance(self, seconds: float) -> None:
        self.now += seconds
        due = sorted(t for t in self._timers if t[0] <= self.now)
        self._timers = [t for t in self._timers if t[0] > self.now]
        for _, _, callback, cancelled in due:
            if not cancelled[0]:
                callback()


@dataclass
class Harness:
    """One shell with recording ports; see the module docstring."""

    policy: ShellPolicy = field(default_factory=lambda: ShellPolicy(delta_interval_s=0.0))
    registry: ConnectionRegistry = field(default_factory=ConnectionRegistry)
    transport: Transport = field(default_factory=Transport)
    chooser: Chooser = field(default_factory=Chooser)
    consent: Consent = field(default_factory=Consent)
    observer: Recorder = field(default_factory=Recorder)
    providers: dict[str, FixtureProvider] = field(default_factory=dict)
    clock: ManualClock | None = None
    shell: Shell = field(init=False)

    def __post_init__(self) -> None:
        self.shell = Shell(
            self.registry,
            self.transport,
            self.chooser,
            self.consent,
            lambda connection: self.providers.setdefault(connection.id, FixtureProvider()),
            policy=self.policy,
            observer=self.observer,
            clock=self.clock,
        )

    def connect(
        self,
        cid: str = "fx",
        *,
        caps: Capabilities = FULL_CAPS,
        model: str = "fixture-model",
        charges: bool = False,
        **extra: Any,
    ) -> FixtureProvider:
        self.registry.add(
            Connection(
                id=cid,
                name=f"Fixture {cid}",
                kind="fixture",
                model=model,
                route=FIXTURE_ROUTE,
                capabilities=caps,
                charges=charges,
                **extra,
            )
        )
        return self.providers.setdefault(cid, FixtureProvider())

    def endpoint(self, name: str = "napplet", domains: frozenset[str] = frozenset({"llm"})) -> str:
        return self.shell.open_endpoint(NappletIdentity(name, "ab" * 32, domains))

    def send(self, endpoint_id: str, envelope: Any) -> None:
        self.shell.receive(endpoint_id, envelope)

    def out(self, endpoint_id: str) -> list[dict[str, Any]]:
        return self.transport.sent.get(endpoint_id, [])

    def results(self, endpoint_id: str, rid: str | None = None) -> list[dict[str, Any]]:
        return [
            e
            for e in self.out(endpoint_id)
            if e["type"].endswith(".result") and (rid is None or e["id"] == rid)
        ]

    def deltas(self, endpoint_id: str, rid: str) -> list[dict[str, Any]]:
        return [
            e for e in self.out(endpoint_id) if e["type"] == "llm.delta" and e["requestId"] == rid
        ]

    async def settle(self) -> None:
        for _ in range(5):
            await asyncio.sleep(0)
        await asyncio.wait_for(self.shell.idle(), 5)

    async def select(
        self, endpoint_id: str, requirements: dict[str, Any] | None = None, rid: str = "s1"
    ) -> str:
        env: dict[str, Any] = {"type": "llm.select", "id": rid}
        if requirements is not None:
            env["requirements"] = requirements
        self.send(endpoint_id, env)
        await self.settle()
        result = self.results(endpoint_id, rid)[-1]
        assert "model" in result, result
        handle: str = result["model"]["handle"]
        return handle


def generate(
    rid: str, handle: str, messages: list[dict[str, Any]] | None = None, **fields: Any
) -> dict[str, Any]:
    request = {"handle": handle, "messages": messages or [user("Hello!")], **fields}
    return {"type": "llm.generate", "id": rid, "request": request}
