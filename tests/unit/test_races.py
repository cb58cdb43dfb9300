"""Races between completion, cancellation and the deadline, in every order.

NAP-LLM, Cancellation and deadlines: "If completion wins the race, its result
stands and cancellation returns false. If cancellation wins, the generation
receives only the cancellation error; late provider output is discarded."
Exactly one terminal result per request id; no delta after it.
"""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

import pytest
from harness import Harness, ManualClock, generate

from napllm.lmsp import LmspEvent
from napllm.providers.fixture import Stall, completed, text_events
from napllm.shell import ShellPolicy


def terminal(h: Harness, ep: str, rid: str) -> list[dict[str, Any]]:
    return [e for e in h.out(ep) if e["type"] == "llm.generate.result" and e["id"] == rid]


def nothing_after_terminal(h: Harness, ep: str, rid: str) -> None:
    envelopes = h.out(ep)
    index = next(
        i for i, e in enumerate(envelopes) if e["type"] == "llm.generate.result" and e["id"] == rid
    )
    assert not [
        e for e in envelopes[index + 1 :] if e["type"] == "llm.delta" and e["requestId"] == rid
    ]


async def setup(stall: float | None = 10.0) -> tuple[Harness, ManualClock, str, str, Any]:
    clock = ManualClock()
    h = Harness(policy=ShellPolicy(deadline_s=30, delta_interval_s=0.0), clock=clock)
    fx = h.connect()
    ep = h.endpoint()
    handle = await h.select(ep)
    events = [
        LmspEvent(event="response.created", data={"response_id": "r"}),
        *text_events(["early "]),
    ]
    fx.queue([*events, Stall(stall), *text_events(["late"], output_index=1), completed()])
    h.send(ep, generate("g1", handle))
    for _ in range(10):
        await asyncio.sleep(0)
    return h, clock, ep, handle, fx


ACTIONS = ("complete", "cancel", "deadline")


@pytest.mark.parametrize("order", list(itertools.permutations(ACTIONS)), ids="-".join)
async def test_every_order_settles_once(order: tuple[str, ...]) -> None:
    h, clock, ep, _, fx = await setup(stall=1.0)
    for action in order:
        if action == "complete":
            await asyncio.sleep(1.2)  # the stall ends; the provider completes
            await asyncio.sleep(0)
        elif action == "cancel":
            h.send(ep, {"type": "llm.cancel", "id": f"c-{len(h.out(ep))}", "requestId": "g1"})
        else:
            clock.advance(31)
    await h.settle()
    results = terminal(h, ep, "g1")
    assert len(results) == 1
    first = order[0]
    expected = {"complete": None, "cancel": "cancelled", "deadline": "timeout"}[first]
    if expected is None:
        assert results[0]["result"]["finish"] == "stop"
    else:
        assert results[0]["error"]["code"] == expected
    cancels = [e for e in h.out(ep) if e["type"] == "llm.cancel.result"]
    assert [c["cancelled"] for c in cancels] == [first == "cancel"]
    nothing_after_terminal(h, ep, "g1")
    sequences = [e["sequence"] for e in h.deltas(ep, "g1")]
    assert sequences == list(range(len(sequences)))
    assert fx.submissions == 1


async def test_cancel_settles_without_waiting_for_a_stuck_provider() -> None:
    h, _, ep, _, fx = await setup(stall=None)  # the provider never answers again
    h.send(ep, {"type": "llm.cancel", "id": "c1", "requestId": "g1"})
    assert terminal(h, ep, "g1")[0]["error"]["code"] == "cancelled"  # synchronously
    await h.settle()
    assert fx.closed_early == 1


async def test_deadline_settles_without_waiting_for_a_stuck_provider() -> None:
    h, clock, ep, _, fx = await setup(stall=None)
    clock.advance(30)
    assert terminal(h, ep, "g1")[0]["error"]["code"] == "timeout"
    await h.settle()
    assert fx.closed_early == 1


@pytest.mark.parametrize("first", ["cancel", "deadline", "decline"])
async def test_races_during_consent(first: str) -> None:
    clock = ManualClock()
    h = Harness(policy=ShellPolicy(deadline_s=5, delta_interval_s=0.0), clock=clock)
    fx = h.connect()
    ep = h.endpoint()
    handle = await h.select(ep)
    h.consent.hold = True
    h.send(ep, generate("g1", handle))
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert len(h.consent.asked) == 1
    if first == "cancel":
        h.send(ep, {"type": "llm.cancel", "id": "c1", "requestId": "g1"})
    elif first == "deadline":
        clock.advance(5)
    else:
        from napllm.shell import ConsentDecision

        h.consent.decision = ConsentDecision(allow=False)
    h.consent.release()
    await h.settle()
    clock.advance(10)
    h.send(ep, {"type": "llm.cancel", "id": "c2", "requestId": "g1"})
    await h.settle()
    code = {"cancel": "cancelled", "deadline": "timeout", "decline": "user-cancelled"}[first]
    assert [r["error"]["code"] for r in terminal(h, ep, "g1")] == [code]
    assert fx.submissions == 0


async def test_completion_is_not_counted_as_closed_early() -> None:
    h = Harness()
    fx = h.connect()
    ep = h.endpoint()
    handle = await h.select(ep)
    h.send(ep, generate("g1", handle))
    await h.settle()
    assert terminal(h, ep, "g1")[0]["result"]["finish"] == "stop"
    assert fx.submissions == 1 and fx.closed_early == 0
