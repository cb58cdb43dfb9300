"""The CPython driver of tests/conformance_scenarios.py: each step against `Harness`.

`drive(scenario, *args)` runs one scenario (a generator of steps) on a fresh
`harness.Harness` holding the six fixture connections the page's test build
has (tests/hooks/napllm_testhooks.py, same ids, names, models and
capabilities), and awaits each step:

- the chooser and the consent dialog stay open until the scenario answers
  them (`PendingChooser`, `PendingConsent`), as on the page;
- waits (`Result`, `WaitDeltas`, ...) yield to the event loop until the
  condition holds, bounded by `WAIT_S` of wall-clock time;
- durations (`Stall` in queued scripts, `Deadline`) run `TIME_SCALE` times
  shorter than the page's: nothing here waits for frames or a person.

`drive_case(table_scenario, case)` plays a table's batch once per test run
(its outcome is plain data; a failure is kept and reported by every case)
and checks `case`.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace
from typing import Any

from harness import FIXTURE_ROUTE, Harness
from napcheck import terminal

import conformance_scenarios as sc
from napllm.connection_records import Capabilities, Connection
from napllm.providers.fixture import FixtureProvider, Stall
from napllm.shell import ChoicePick, ChoiceRequest, ConsentDecision, Disclosure, ShellPolicy

#: Factor on the scenarios' durations (page seconds -> seconds here).
TIME_SCALE = 1 / 25
#: Upper bound of one wait, wall-clock seconds.
WAIT_S = 5.0
#: How long `Received` lets late messages arrive (wall-clock seconds).
QUIET_S = 0.01

_FULL = Capabilities(
    images=True,
    images_in_tool_results=True,
    json_output=True,
    tools=True,
    tool_choice_modes=("auto", "none", "required", "tool"),
)
_AUTO = Capabilities(tools=True, tool_choice_modes=("auto", "none"))
#: The page's fixture connections: (fixture, capabilities, charges).
CONNECTIONS: list[tuple[sc.Fixture, Capabilities, bool]] = [
    (sc.FULL, _FULL, False),
    (sc.TEXT, Capabilities(), False),
    (sc.JSON_ONLY, Capabilities(json_output=True), False),
    (sc.AUTO, _AUTO, False),
    (sc.REASONING, _AUTO.model_copy(update={"requires_reasoning_state": True}), False),
    (sc.PAID, _FULL, True),
]


class PendingChooser:
    """A chooser whose every request stays open until `answer` is called."""

    def __init__(self) -> None:
        self.requests: list[ChoiceRequest] = []
        self.pending: list[tuple[ChoiceRequest, asyncio.Future[ChoicePick | None]]] = []

    async def choose(self, request: ChoiceRequest) -> ChoicePick | None:
        future: asyncio.Future[ChoicePick | None] = asyncio.get_running_loop().create_future()
        entry = (request, future)
        self.requests.append(request)
        self.pending.append(entry)
        try:
            return await future
        finally:
            if entry in self.pending:  # withdrawn by the shell (cancelled)
                self.pending.remove(entry)

    def answer(self, connection_id: str | None) -> None:
        request, future = self.pending.pop(0)
        future.set_result(
            None if connection_id is None else ChoicePick(connection_id, request.revision)
        )


class PendingConsent:
    """A consent dialog whose every question stays open until `answer` is called."""

    def __init__(self) -> None:
        self.asked: list[Disclosure] = []
        self.pending: list[asyncio.Future[ConsentDecision]] = []

    async def ask(self, disclosure: Disclosure) -> ConsentDecision:
        future: asyncio.Future[ConsentDecision] = asyncio.get_running_loop().create_future()
        self.asked.append(disclosure)
        self.pending.append(future)
        try:
            return await future
        finally:
            if future in self.pending:  # withdrawn by the shell (cancelled)
                self.pending.remove(future)

    def answer(self, decision: ConsentDecision) -> None:
        self.pending.pop(0).set_result(decision)


ANSWERS = {
    "allow": ConsentDecision(allow=True),
    "remember": ConsentDecision(allow=True, remember=True),
    "deny": ConsentDecision(allow=False),
    "escape": ConsentDecision(allow=False),
}


async def wait(condition: Any, what: str) -> None:
    """Yield to the loop until `condition()` holds (at most `WAIT_S`)."""
    end = time.monotonic() + WAIT_S
    spins = 0
    while not condition():
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        spins += 1
        await asyncio.sleep(0 if spins < 100 else 0.001)


def scaled(script: list[Any]) -> list[Any]:
    """`script` with every finite `Stall` `TIME_SCALE` times shorter."""
    return [
        Stall(step.seconds * TIME_SCALE)
        if isinstance(step, Stall) and step.seconds is not None
        else step
        for step in script
    ]


class HarnessDriver:
    """Performs scenario steps on one `Harness` (see the module docstring)."""

    def __init__(self) -> None:
        self.chooser = PendingChooser()
        self.consent = PendingConsent()
        self.h = Harness(
            policy=ShellPolicy(delta_interval_s=0.0),
            chooser=self.chooser,  # type: ignore[arg-type]
            consent=self.consent,  # type: ignore[arg-type]
        )
        self.fixtures: dict[str, FixtureProvider] = {}
        self.originals: dict[str, Connection] = {}
        for fixture, caps, charges in CONNECTIONS:
            self.originals[fixture.cid] = self.h.registry.add(
                Connection(
                    id=fixture.cid,
                    name=fixture.name,
                    kind="fixture",
                    model=fixture.model,
                    route=FIXTURE_ROUTE,
                    capabilities=caps,
                    charges=charges,
                )
            )
            self.fixtures[fixture.cid] = self.h.providers.setdefault(fixture.cid, FixtureProvider())
        self.opened = 0

    async def perform(self, step: Any) -> Any:
        h = self.h
        if isinstance(step, sc.Open):
            self.opened += 1
            domains = frozenset({"llm"}) if step.llm else frozenset()
            return h.endpoint(f"napplet-{self.opened}", domains)
        if isinstance(step, sc.Post):
            h.send(step.app, step.envelope)
            return None
        if isinstance(step, sc.Choose):
            await wait(lambda: self.chooser.pending, "the chooser")
            self.chooser.answer(None if step.connection is None else step.connection.cid)
            return None
        if isinstance(step, sc.Candidates):
            await wait(lambda: self.chooser.pending, "the chooser")
            request = self.chooser.pending[0][0]
            return [c.name for c in request.candidates]
        if isinstance(step, sc.Consent):
            await wait(lambda: self.consent.pending, "the consent dialog")
            self.consent.answer(ANSWERS[step.answer])
            return None
        if isinstance(step, sc.AwaitConsent):
            await wait(lambda: self.consent.pending, "the consent dialog")
            return None
        if isinstance(step, sc.DialogsOpen):
            await self.quiet()
            return len(self.chooser.pending) + len(self.consent.pending)
        if isinstance(step, sc.DialogsClosed):
            await wait(
                lambda: not self.chooser.pending and not self.consent.pending, "dialogs to close"
            )
            return None
        if isinstance(step, sc.Result):
            await wait(
                lambda: any(
                    e["type"] == step.kind and e["id"] == step.rid
                    for e in h.out(step.app)
                    if "id" in e
                ),
                f"{step.kind} {step.rid}",
            )
            return terminal(h, step.app, step.rid, step.kind)
        if isinstance(step, sc.Results):
            await wait(
                lambda: sum(e["type"] == step.kind for e in h.out(step.app)) >= step.count,
                f"{step.count} x {step.kind}",
            )
            return None
        if isinstance(step, sc.WaitDeltas):
            await wait(
                lambda: len(h.deltas(step.app, step.rid)) >= step.count, f"deltas of {step.rid}"
            )
            return None
        if isinstance(step, sc.Received):
            if step.quiet:
                await self.quiet()
            return list(h.out(step.app))
        if isinstance(step, sc.Queue):
            self.fixtures[step.connection.cid].queue(scaled(step.script))
            return None
        if isinstance(step, sc.Stats):
            fx = self.fixtures[step.connection.cid]
            return {
                "submissions": fx.submissions,
                "closedEarly": fx.closed_early,
                "requests": [r.to_json() for r in fx.requests],
            }
        if isinstance(step, sc.WaitStat):
            stats = {"submissions": "submissions", "closedEarly": "closed_early"}
            fx = self.fixtures[step.connection.cid]
            await wait(lambda: getattr(fx, stats[step.key]) >= step.at_least, f"{step.key} of {fx}")
            return None
        if isinstance(step, sc.Account):
            h.shell.switch_account(step.name)
            return None
        if isinstance(step, sc.EditConnection):
            h.registry.edit(step.connection.cid, name=step.name)
            return None
        if isinstance(step, sc.RemoveConnection):
            h.registry.remove(step.connection.cid)
            return None
        if isinstance(step, sc.RestoreConnection):
            original = self.originals[step.connection.cid]
            if h.registry.get(original.id) is None:
                h.registry.add(original)
            elif h.registry.get(original.id) != original:
                h.registry.edit(original.id, name=original.name)
            return None
        if isinstance(step, sc.Deadline):
            h.shell.policy = replace(h.shell.policy, deadline_s=step.seconds * TIME_SCALE)
            return None
        raise TypeError(f"unknown step {step!r}")

    async def quiet(self) -> None:
        """Let the shell's work run until it is idle or waits (dialog, stalled provider)."""
        for _ in range(20):
            await asyncio.sleep(0)
        # not `shell.idle()` under a timeout: cancelling it would cancel the shell's tasks
        tasks = list(self.h.shell._tasks)
        if tasks:
            await asyncio.wait(tasks, timeout=QUIET_S)

    async def close(self) -> None:
        """Close every endpoint (pending dialogs are cancelled) and wait for the tasks."""
        await asyncio.wait_for(self.h.shell.aclose(), WAIT_S)


async def drive(scenario: Any, *args: Any) -> Any:
    """Run `scenario(*args)` on a fresh `HarnessDriver`; returns its return value."""
    driver = HarnessDriver()
    steps = scenario(*args)
    value: Any = None
    try:
        while True:
            try:
                step = steps.send(value)
            except StopIteration as stop:
                return stop.value
            value = await driver.perform(step)
    finally:
        await driver.close()


_batches: dict[str, Any] = {}


async def drive_case(table: sc.TableScenario, case: str) -> None:
    """Check `case` on the batch of `table` (played once per test run on its own
    harness; a failure is kept and reported by every case of the table)."""
    if table.key not in _batches:
        try:
            _batches[table.key] = await drive(table.batch)
        except Exception as exc:
            _batches[table.key] = exc
    outcome = _batches[table.key]
    if isinstance(outcome, Exception):
        raise AssertionError(f"the batch of {table.key} failed: {outcome!r}") from outcome
    table.check(outcome, case)
