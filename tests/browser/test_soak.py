"""Soak test of the real shell in Chromium: many generations over 10 napplets.

The shell runs in test mode (``?test=1``: fixture connections and
``window.napllmTest``); 10 tabs run the probe napplet
(tests/browser/napplets/probe.html), which records every envelope the shell
delivers to it. Each napplet selects the fixture connection in the chooser;
the first generation is allowed with "remember", so the rest run under the
standing permission. Then waves of concurrent generations, spread at random
over the napplets, each of one kind chosen at random:

- ``mixed``: streams of many small text deltas, streams that stall briefly,
  provider failures and provider crashes, shuffled;
- ``cancel``: streams that stall forever, each cancelled by its napplet;
- ``race``: short streams cancelled while they run (either outcome is valid);
- ``deadline``: streams that stall forever under a 0.4 s deadline
  (``napllmTest.setDeadline``).

After every wave, each napplet's complete envelope log is checked: exactly
one terminal result per request, deltas contiguous from 0 and none after the
terminal, every envelope naming one of that napplet's own ids (nothing
delivered to another endpoint), and the outcomes matching the scripts (the
fixture queue is shared, so outcomes are compared as counts). The logs are
then cleared, so only the shell's own memory remains. At the end the page's
JS heap, measured with CDP after ``HeapProfiler.collectGarbage``, must be
within `HEAP_TOLERANCE` of its level after the first wave.

``-m soak`` runs `SOAK_SIZE` generations; ``-m soak_long`` the full 1,000.

This module stays on the test build: the deadline waves need
``napllmTest.setDeadline`` (the deadline is no product setting), and the
provider crashes (an exception that is no provider failure) have no
scripted-connection turn.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from shellpage import Napplet, ShellPage, boot_shell, check_generation, code

from napllm.providers.fixture import Crash, Fail, Stall, completed, text_events

pytestmark = pytest.mark.browser

SOAK_SIZE = 150
SOAK_LONG_SIZE = 1_000
NAPPLETS = 10
CONNECTION = "fx-full"
CONNECTION_NAME = "Fixture (all capabilities)"
SHORT_DEADLINE_S = 0.4
NORMAL_DEADLINE_S = 300.0
WAVE_TIMEOUT_MS = 60_000
#: The JS heap after the run may exceed its level after the first wave by
#: this fraction plus `HEAP_SLACK_BYTES` (GC timing and JIT code vary).
HEAP_TOLERANCE = 0.25
HEAP_SLACK_BYTES = 2 * 1024 * 1024
WAVE_KINDS = ("mixed", "mixed", "cancel", "race", "deadline")
POLL_MS = 20


@dataclass
class Planned:
    """One generation: the napplet (index) that sends it, its id and script kind."""

    napplet: int
    rid: str
    script: str


def script(kind: str, rng: random.Random) -> list[Any]:
    """The fixture script of one generation of kind `kind`."""
    chunks = [f"t{i} " for i in range(rng.randint(5, 80))]
    body = text_events(chunks)
    if kind == "text":
        return [*body, completed()]
    if kind == "stall-text":
        return [*body[:3], Stall(0.05), *body[3:], completed()]
    if kind == "fail":
        return [*body[:4], Fail(detail="SOAK-SECRET body")]
    if kind == "crash":
        return [*body[:2], Crash("SOAK-SECRET trace")]
    if kind == "stall":
        return [*body[:3], Stall(None)]
    assert kind == "race"
    return [*body[:2], Stall(0.002), *body[2:], completed()]


def generate(rid: str, handle: str) -> dict[str, Any]:
    return {
        "type": "llm.generate",
        "id": rid,
        "request": {
            "handle": handle,
            "messages": [{"role": "user", "content": [{"type": "text", "text": rid}]}],
        },
    }


class Soak:
    """The booted shell, its 10 probe napplets and their handles."""

    def __init__(self, shell: ShellPage, cdp: Any) -> None:
        self.shell = shell
        self.cdp = cdp
        self.apps: list[Napplet] = []
        self.handles: list[str] = []
        self.outcomes: Counter[str] = Counter()
        self.count = 0
        self.posted = 0

    def prefix(self, index: int) -> str:
        return f"n{index}-"

    def setup(self) -> None:
        """Open the napplets, select the fixture in each, grant standing consent."""
        for i in range(NAPPLETS):
            app = self.shell.open_napplet()
            self.apps.append(app)
            self.handles.append(app.select(CONNECTION_NAME, rid=f"{self.prefix(i)}select"))
            self.shell.queue(CONNECTION, script("text", random.Random(i)))
            rid = f"{self.prefix(i)}warm"
            app.post(generate(rid, self.handles[i]))
            self.posted += 1
            if i == 0 or self.shell.open_dialogs() > 0:
                self.shell.remember()
            app.wait_for(rid)
            check_generation(app.envelopes(), rid)
            self.clear(app)

    def clear(self, app: Napplet) -> None:
        """Drop what the probe recorded (it is the test's memory, not the shell's)."""
        app.evaluate("() => { window.probe.received.length = 0; }")

    def heap(self) -> int:
        """The page's used JS heap in bytes, after a full garbage collection."""
        for _ in range(2):
            self.cdp.send("HeapProfiler.collectGarbage")
        usage = self.cdp.send("Runtime.getHeapUsage")
        return int(usage["usedSize"])

    def wave(self, kind: str, size: int, rng: random.Random) -> None:
        """Run one wave of `size` generations of `kind` and check every log."""
        plans: list[Planned] = []
        for _ in range(size):
            index = rng.randrange(NAPPLETS)
            rid = f"{self.prefix(index)}g{self.count}"
            self.count += 1
            if kind == "mixed":
                chosen = rng.choice(("text", "text", "stall-text", "fail", "crash"))
            else:
                chosen = {"cancel": "stall", "deadline": "stall", "race": "race"}[kind]
            plans.append(Planned(index, rid, chosen))
        # The fixture queue is shared and consumed in submission order.
        for plan in plans:
            self.shell.queue(CONNECTION, script(plan.script, rng))
        if kind == "deadline":
            self.shell.set_deadline(SHORT_DEADLINE_S)
        try:
            for plan in plans:
                self.apps[plan.napplet].post(generate(plan.rid, self.handles[plan.napplet]))
                self.posted += 1
            if kind in ("cancel", "race"):
                if kind == "cancel":  # every stream has started and stalls
                    self.wait_submissions()
                for plan in plans:
                    self.apps[plan.napplet].post(
                        {"type": "llm.cancel", "id": plan.rid + "-c", "requestId": plan.rid}
                    )
            for index in {p.napplet for p in plans}:
                rids = [p.rid for p in plans if p.napplet == index]
                self.apps[index].frame.wait_for_function(
                    "(ids) => { const done = new Set(window.probe.envelopes()"
                    ".filter((e) => e && e.type === 'llm.generate.result').map((e) => e.id));"
                    " return ids.every((id) => done.has(id)); }",
                    arg=rids,
                    timeout=WAVE_TIMEOUT_MS,
                    polling=POLL_MS,
                )
        finally:
            if kind == "deadline":
                self.shell.set_deadline(NORMAL_DEADLINE_S)
        self.check(kind, plans)

    def wait_submissions(self) -> None:
        """Wait until every generation posted so far has reached the fixture provider."""
        self.shell.page.wait_for_function(
            "([c, n]) => JSON.parse(window.napllmTest.stats(c)).submissions >= n",
            arg=[CONNECTION, self.posted],
            polling=100,
            timeout=WAVE_TIMEOUT_MS,
        )

    def check(self, kind: str, plans: list[Planned]) -> None:
        """The per-request, per-endpoint and outcome rules of one wave."""
        got: Counter[str] = Counter()
        for index, app in enumerate(self.apps):
            envelopes = app.quiet()
            for envelope in envelopes:
                ident = str(envelope.get("id", envelope.get("requestId")))
                assert ident.startswith(self.prefix(index)), f"napplet {index} got {envelope}"
            for plan in (p for p in plans if p.napplet == index):
                result = check_generation(envelopes, plan.rid)
                outcome = code(result) or "ok"
                assert "SOAK-SECRET" not in str(result)
                got[outcome] += 1
                if kind in ("cancel", "race"):
                    answers = [
                        e
                        for e in envelopes
                        if e.get("type") == "llm.cancel.result" and e.get("id") == plan.rid + "-c"
                    ]
                    assert len(answers) == 1, answers
                    assert answers[0].get("cancelled") is (outcome == "cancelled"), answers
            self.clear(app)
        scripts = Counter(p.script for p in plans)
        if kind == "mixed":
            expected = Counter(
                {
                    "ok": scripts["text"] + scripts["stall-text"],
                    "provider-error": scripts["fail"] + scripts["crash"],
                }
            )
        elif kind == "cancel":
            expected = Counter({"cancelled": len(plans)})
        elif kind == "deadline":
            expected = Counter({"timeout": len(plans)})
        else:
            assert set(got) <= {"ok", "cancelled"}, got
            expected = got
        assert +got == +expected, (kind, got, expected)
        self.outcomes.update(got)


@pytest.fixture
def soak_shell(browser: Any, dist_url: str, test_pages_dir: Path) -> Iterator[Soak]:
    context = browser.new_context()
    try:
        page = context.new_page()
        shell = boot_shell(page, dist_url, test_pages_dir)
        cdp = context.new_cdp_session(page)
        yield Soak(shell, cdp)
    finally:
        context.close()


def run(soak: Soak, total: int, seed: int) -> None:
    rng = random.Random(seed)
    soak.setup()
    done = 0
    baseline = 0
    waves = 0
    # Every kind early (the first wave is the warm-up for the heap baseline).
    first = ["mixed", *rng.sample(["cancel", "race", "deadline", "mixed"], 4)]
    while done < total:
        size = min(total - done, rng.randint(10, 30))
        kind = first[waves] if waves < len(first) else rng.choice(WAVE_KINDS)
        soak.wave(kind, size, rng)
        done += size
        waves += 1
        if waves == 1:
            baseline = soak.heap()
    end = soak.heap()
    assert sum(soak.outcomes.values()) == total
    for outcome in ("ok", "provider-error", "cancelled", "timeout"):
        assert soak.outcomes[outcome] > 0, soak.outcomes
    limit = baseline * (1 + HEAP_TOLERANCE) + HEAP_SLACK_BYTES
    assert end <= limit, f"JS heap {end} bytes after the run, {baseline} after the first wave"
    print(f"soak: {total} generations, outcomes {dict(soak.outcomes)}, heap {baseline} -> {end}")


@pytest.mark.soak
def test_soak(soak_shell: Soak) -> None:
    run(soak_shell, SOAK_SIZE, seed=150)


@pytest.mark.soak
@pytest.mark.soak_long
def test_soak_long(soak_shell: Soak) -> None:
    run(soak_shell, SOAK_LONG_SIZE, seed=1000)
