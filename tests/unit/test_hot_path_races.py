"""Races of completion, cancellation and the deadline through the page's hot path.

The orders of `test_races.py`, with the page's two batching layers in
place: the loop's ready callbacks run through a `ReadyQueue` (one callback
per pass, or passes bounded by the real budget) and envelopes reach the
page through `BridgeTransport`, handed over in batches after the run that
sent them. What a napplet receives must not change: exactly one terminal
result, no delta after it, contiguous sequences, and each envelope at its
own endpoint only.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import types
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest
from fake_js import browser_module
from harness import Harness, ManualClock, generate

from napllm.browser.loop import DRAIN_BUDGET_S, ReadyQueue
from napllm.lmsp import LmspEvent
from napllm.providers.fixture import Stall, completed, text_events
from napllm.shell import ShellPolicy


class Host:
    """The page's `napllmHost.postAll`: each batch parsed as JSON.parse would, per endpoint."""

    def __init__(self) -> None:
        self.sent: dict[str, list[dict[str, Any]]] = {}
        self.batches = 0

    def postAll(self, text: str) -> None:
        self.batches += 1
        for endpoint_id, envelope in json.loads(text, parse_constant=_refuse):
            self.sent.setdefault(endpoint_id, []).append(envelope)


def _refuse(name: str) -> Any:
    raise ValueError(name)


class PageTransport:
    """`BridgeTransport` with its hand-over scheduled on the loop; `sent` as delivered."""

    def __init__(self, module: types.ModuleType, host: Host, schedule: Any) -> None:
        self._bridge = module.BridgeTransport(schedule=schedule)
        self.sent = host.sent

    def send(self, endpoint_id: str, envelope: dict[str, Any]) -> None:
        self._bridge.send(endpoint_id, envelope)


@asynccontextmanager
async def page_loop(budget_s: float) -> AsyncIterator[tuple[PageTransport, Host]]:
    """The running loop with a ReadyQueue, and a BridgeTransport to a recording host."""
    loop = asyncio.get_running_loop()
    original: Callable[..., Any] = loop.call_soon
    queue = ReadyQueue(loop, lambda fn: original(fn), lambda fn: original(fn), budget_s=budget_s)
    host = Host()
    with browser_module("napllm.browser.bridge", napllmHost=host) as module:
        loop.call_soon = queue.call_soon  # type: ignore[method-assign]
        loop.call_soon_threadsafe = queue.call_soon  # type: ignore[method-assign]
        try:
            yield PageTransport(module, host, lambda fn: original(fn)), host
            for _ in range(100):  # let the queue run dry before the loop is restored
                if not len(queue):
                    break
                await asyncio.sleep(0)
        finally:
            del loop.call_soon  # type: ignore[method-assign]
            del loop.call_soon_threadsafe  # type: ignore[method-assign]
    assert queue.passes > 0


async def until(condition: Callable[[], bool]) -> None:
    """Wait for what the page received (a hand-over runs after the pass that sent it)."""
    for _ in range(500):
        if condition():
            return
        await asyncio.sleep(0.001)
    assert condition()


async def select(h: Harness, ep: str, rid: str) -> str:
    h.send(ep, {"type": "llm.select", "id": rid})
    await until(lambda: bool(h.results(ep, rid)))
    handle: str = h.results(ep, rid)[-1]["model"]["handle"]
    return handle


def nothing_after_terminal(h: Harness, ep: str, rid: str) -> None:
    envelopes = h.out(ep)
    ends = [
        i for i, e in enumerate(envelopes) if e["type"] == "llm.generate.result" and e["id"] == rid
    ]
    assert len(ends) == 1
    assert not [
        e
        for e in envelopes[ends[0] + 1 :]
        if e["type"] == "llm.delta" and e.get("requestId") == rid
    ]


ACTIONS = ("complete", "cancel", "deadline")


@pytest.mark.parametrize("budget_s", [0.0, DRAIN_BUDGET_S], ids=["one-per-pass", "budget"])
@pytest.mark.parametrize("order", list(itertools.permutations(ACTIONS)), ids="-".join)
async def test_every_order_settles_once_through_the_page_hot_path(
    order: tuple[str, ...], budget_s: float
) -> None:
    async with page_loop(budget_s) as (transport, host):
        clock = ManualClock()
        h = Harness(
            policy=ShellPolicy(deadline_s=30, delta_interval_s=0.0),
            clock=clock,
            transport=transport,  # type: ignore[arg-type]
        )
        fx = h.connect()
        ep = h.endpoint()
        other = h.endpoint("other")
        handle = await select(h, ep, "s1")
        other_handle = await select(h, other, "s2")
        events = [
            LmspEvent(event="response.created", data={"response_id": "r"}),
            *text_events(["early ", "words ", "more "]),
        ]
        fx.queue([*events, Stall(0.2), *text_events(["late"], output_index=1), completed()])
        h.send(ep, generate("g1", handle))
        for _ in range(10):
            await asyncio.sleep(0)
        for action in order:
            if action == "complete":
                await asyncio.sleep(0.3)
                await asyncio.sleep(0)
            elif action == "cancel":
                h.send(ep, {"type": "llm.cancel", "id": "c1", "requestId": "g1"})
            else:
                clock.advance(31)
        await h.settle()
        await until(lambda: bool(h.results(ep, "g1")))
        for _ in range(5):
            await asyncio.sleep(0.001)
        results = [e for e in h.out(ep) if e["type"] == "llm.generate.result"]
        assert len(results) == 1
        expected = {"complete": None, "cancel": "cancelled", "deadline": "timeout"}[order[0]]
        if expected is None:
            assert results[0]["result"]["finish"] == "stop"
        else:
            assert results[0]["error"]["code"] == expected
        nothing_after_terminal(h, ep, "g1")
        sequences = [e["sequence"] for e in h.deltas(ep, "g1")]
        assert sequences == list(range(len(sequences)))
        # The other endpoint got its own select answer and nothing of g1's.
        assert [e["type"] for e in h.out(other)] == ["llm.select.result"]
        assert other_handle
        assert host.batches > 0
