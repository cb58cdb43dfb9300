"""Soak test of the shell under CPython: many generations over 10 napplets.

One `Shell` (tests/unit/harness.py, fixture providers, a manual clock for
deadlines) runs waves of concurrent generations with a random mix of
outcomes: streamed text of many small deltas, provider failures, provider
crashes, stalls ended by a cancel, stalls ended by the deadline, and cancels
that race a running stream. Every wave is checked on each endpoint's complete
envelope log (NAP-LLM, Wire Protocol; Delta; Cancellation and deadlines):

- exactly one terminal result per request, with the outcome its script
  implies (text -> the exact text, fail/crash -> ``provider-error``, cancel
  -> ``cancelled``, deadline -> ``timeout``; a racing cancel -> ``cancelled``
  or the complete text);
- deltas contiguous from sequence 0, none after the terminal result;
- no envelope delivered to another endpoint (every id names its endpoint);
- after the run: no generation, task or queued script is left in the shell,
  and traced Python memory is back within `MEMORY_TOLERANCE_BYTES` of its
  level after the first wave (the warm-up).

``-m soak`` runs `SOAK_SIZE` generations (the CI size); ``-m soak_long``
runs the full 1,000.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import random
import tracemalloc
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import pytest
from harness import Harness, ManualClock, generate, user
from napcheck import check_generation, code, terminal

from napllm.lmsp import LmspRequest, MessageItemIn
from napllm.providers.fixture import (
    Crash,
    Fail,
    Script,
    Stall,
    completed,
    text_events,
)
from napllm.shell import ShellPolicy

SOAK_SIZE = 200
SOAK_LONG_SIZE = 1_000
NAPPLETS = 10
WAVE = 25
DEADLINE_S = 30.0
#: Traced memory may end this far above its level after the first wave.
MEMORY_TOLERANCE_BYTES = 256 * 1024
KINDS = ("text", "text", "text", "fail", "crash", "cancel", "deadline", "race")


@dataclass
class Planned:
    """One generation of the soak: where it goes, what its provider does."""

    endpoint: str
    rid: str
    kind: str
    chunks: list[str]


def script_for(request: LmspRequest, plans: dict[str, Planned]) -> Script:
    """The fixture script named by the request's last user text (the plan's rid)."""
    key = ""
    for item in request.input:
        if isinstance(item, MessageItemIn) and item.role == "user":
            key = "".join(getattr(p, "text", "") for p in item.content)
    plan = plans[key]
    body = text_events(plan.chunks)
    if plan.kind == "text":
        return [*body, completed()]
    if plan.kind == "fail":
        return [*body[:3], Fail(detail="SOAK-SECRET provider body")]
    if plan.kind == "crash":
        return [*body[:2], Crash("SOAK-SECRET traceback")]
    if plan.kind in ("cancel", "deadline"):
        return [*body[:2], Stall(None)]
    # "race": a stream that yields between deltas while a cancel is on its way.
    return [*body[:-1], Stall(0.0005), body[-1], completed()]


class _Timer:
    """A cancellable timer entry of `SoakClock` (its flag lives in the clock's list)."""

    __slots__ = ("_flag",)

    def __init__(self, flag: list[bool]) -> None:
        self._flag = flag

    def cancel(self) -> None:
        self._flag[0] = True


class SoakClock(ManualClock):
    """`ManualClock` whose timer handles share one class (the harness makes a class
    per timer), so the clock keeps nothing alive once its timers are due."""

    def call_later(self, delay: float, callback: Callable[[], None]) -> Any:
        self._serial += 1
        flag = [False]
        self._timers.append((self.now + delay, self._serial, callback, flag))
        return _Timer(flag)


async def pump(turns: int = 50) -> None:
    """Let the event loop run `turns` rounds."""
    for _ in range(turns):
        await asyncio.sleep(0)


async def run_soak(total: int, seed: int) -> dict[str, Any]:
    """Run `total` generations in waves; returns the outcome counts and memory figures."""
    rng = random.Random(seed)
    clock = SoakClock()
    h = Harness(policy=ShellPolicy(deadline_s=DEADLINE_S, delta_interval_s=0.0), clock=clock)
    plans: dict[str, Planned] = {}
    fx = h.connect()
    fx.default = lambda request: script_for(request, plans)
    endpoints = [h.endpoint(f"soak-{i}") for i in range(NAPPLETS)]
    handles = {ep: await h.select(ep, rid=f"{ep}-select") for ep in endpoints}
    for ep in endpoints:
        h.transport.sent[ep].clear()
    outcomes: Counter[str] = Counter()
    baseline = 0
    done = 0
    wave_no = 0
    while done < total:
        size = min(WAVE, total - done)
        wave: list[Planned] = []
        for _ in range(size):
            ep = rng.choice(endpoints)
            rid = f"{ep}-g{done + len(wave)}"
            chunks = [f"w{i} " for i in range(rng.randint(3, 60))]
            plan = Planned(ep, rid, rng.choice(KINDS), chunks)
            plans[rid] = plan
            wave.append(plan)
            h.send(ep, generate(rid, handles[ep], [user(rid)]))
            if rng.random() < 0.3:
                await pump(rng.randint(0, 5))
        await pump()
        # Cancels: the stalled ones now, the racing ones mid-stream.
        for plan in wave:
            if plan.kind in ("cancel", "race"):
                h.send(
                    plan.endpoint,
                    {"type": "llm.cancel", "id": plan.rid + "-c", "requestId": plan.rid},
                )
        await pump()
        for _ in range(200):
            if all(h.results(p.endpoint, p.rid) or p.kind == "deadline" for p in wave):
                break
            await asyncio.sleep(0.001)
        clock.advance(DEADLINE_S + 1)  # the remaining stalls expire
        await h.settle()

        check_wave(h, wave, endpoints, outcomes)
        # What the test's recorders keep is not the shell's memory.
        for ep in endpoints:
            h.transport.sent[ep].clear()
        fx.requests.clear()
        h.observer.submissions.clear()
        h.observer.notices.clear()
        h.consent.asked.clear()
        for plan in wave:
            del plans[plan.rid]
        done += size
        wave_no += 1
        if wave_no == 1:
            gc.collect()
            baseline = tracemalloc.get_traced_memory()[0]

    assert fx.submissions == total  # every request reached the provider exactly once
    for ep in endpoints:
        h.shell.close_endpoint(ep)
    await h.settle()
    assert not h.shell._tasks, "tasks outlived the soak"
    assert not h.shell._endpoints
    assert not plans
    gc.collect()
    end = tracemalloc.get_traced_memory()[0]
    return {"outcomes": outcomes, "baseline": baseline, "end": end}


def check_wave(
    h: Harness, wave: list[Planned], endpoints: list[str], outcomes: Counter[str]
) -> None:
    """Assert the per-request and per-endpoint rules for one wave."""
    for ep in endpoints:
        for envelope in h.out(ep):
            ident = str(envelope.get("id", envelope.get("requestId")))
            assert ident.startswith(ep + "-"), f"{ep} received {envelope}"
    for plan in wave:
        result = terminal(h, plan.endpoint, plan.rid)
        deltas = h.deltas(plan.endpoint, plan.rid)
        assert [d["sequence"] for d in deltas] == list(range(len(deltas)))
        envelopes = h.out(plan.endpoint)
        end_at = envelopes.index(result)
        assert all(envelopes.index(d) < end_at for d in deltas), "a delta after the terminal"
        got = code(result)
        if plan.kind == "text" or (plan.kind == "race" and got is None):
            check_generation(h, plan.endpoint, plan.rid)
            text = "".join(p["text"] for p in result["result"]["content"] if p["type"] == "text")
            assert text == "".join(plan.chunks)
            outcomes["race-text" if plan.kind == "race" else "text"] += 1
            continue
        expected = {
            "fail": "provider-error",
            "crash": "provider-error",
            "cancel": "cancelled",
            "race": "cancelled",
            "deadline": "timeout",
        }[plan.kind]
        assert got == expected, (plan.kind, result)
        assert "SOAK-SECRET" not in str(result)
        outcomes[expected] += 1
        if plan.kind in ("cancel", "race"):
            answers = h.results(plan.endpoint, plan.rid + "-c")
            assert len(answers) == 1 and answers[0]["cancelled"] is True, answers


def soak(total: int) -> None:
    # The shell logs every provider failure; pytest would keep each record in
    # memory for its report, which is not the shell's memory.
    logger = logging.getLogger("napllm")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    tracemalloc.start()
    try:
        # A thread of its own: in a full run, Playwright's sync API may already
        # hold an event loop on the main thread, where asyncio.run() refuses to start.
        with ThreadPoolExecutor(1) as pool:
            report = pool.submit(asyncio.run, run_soak(total, seed=20261130 + total)).result()
    finally:
        tracemalloc.stop()
        logger.setLevel(level)
    outcomes = report["outcomes"]
    assert sum(outcomes.values()) == total
    for kind in ("text", "provider-error", "cancelled", "timeout"):
        assert outcomes[kind] > 0, f"the mix never produced {kind}: {outcomes}"
    growth = report["end"] - report["baseline"]
    assert growth < MEMORY_TOLERANCE_BYTES, f"traced memory grew by {growth} bytes"


@pytest.mark.soak
def test_soak_core() -> None:
    soak(SOAK_SIZE)


@pytest.mark.soak
@pytest.mark.soak_long
def test_soak_core_long() -> None:
    soak(SOAK_LONG_SIZE)
