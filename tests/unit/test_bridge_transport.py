"""The shell's transport in the page (napllm.browser.bridge.BridgeTransport).

Envelopes sent during one run of Python reach the page together, in order,
as one `napllmHost.postAll` call; the page posts each to its endpoint's frame.
"""

from __future__ import annotations

import json
import types
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from fake_js import browser_module


class Host:
    """A stand-in for the page's `napllmHost`: records every batch."""

    def __init__(self) -> None:
        self.batches: list[Any] = []

    def postAll(self, text: str) -> None:
        # The page's JSON.parse: no NaN or Infinity (one bad envelope loses the batch).
        self.batches.append(json.loads(text, parse_constant=_not_json))


def _not_json(name: str) -> Any:
    raise ValueError(f"JSON.parse refuses {name}")


@pytest.fixture
def bridge() -> Iterator[tuple[types.ModuleType, Host]]:
    host = Host()
    with browser_module("napllm.browser.bridge", napllmHost=host) as module:
        yield module, host


def test_one_runs_envelopes_go_together_in_order(
    bridge: tuple[types.ModuleType, Host],
) -> None:
    module, host = bridge
    scheduled: list[Callable[[], None]] = []
    transport = module.BridgeTransport(schedule=scheduled.append)
    transport.send("ep1", {"type": "llm.delta", "requestId": "g1", "sequence": 0})
    transport.send("ep2", {"type": "llm.select.result", "id": "s1", "model": {"name": "é"}})
    transport.send("ep1", {"type": "llm.generate.result", "id": "g1", "result": {}})
    # One hand-over is scheduled for the whole run; nothing reached the page yet.
    assert len(scheduled) == 1
    assert host.batches == []
    scheduled.pop()()
    assert host.batches == [
        [
            ["ep1", {"type": "llm.delta", "requestId": "g1", "sequence": 0}],
            ["ep2", {"type": "llm.select.result", "id": "s1", "model": {"name": "é"}}],
            ["ep1", {"type": "llm.generate.result", "id": "g1", "result": {}}],
        ]
    ]
    # A flush with nothing queued posts nothing; the next send schedules again.
    transport.flush()
    assert len(host.batches) == 1
    transport.send("ep1", {"type": "llm.cancel.result", "id": "c1", "cancelled": False})
    assert len(scheduled) == 1
    transport.flush()
    assert host.batches[-1] == [
        ["ep1", {"type": "llm.cancel.result", "id": "c1", "cancelled": False}]
    ]


def test_an_envelope_is_serialized_when_sent(bridge: tuple[types.ModuleType, Host]) -> None:
    """A record changed after `send` does not change what the frame receives."""
    module, host = bridge
    transport = module.BridgeTransport(schedule=lambda _flush: None)
    envelope: dict[str, Any] = {"type": "llm.delta", "requestId": "g1", "text": "a"}
    transport.send("ep1", envelope)
    envelope["text"] = "changed"
    transport.flush()
    assert host.batches == [[["ep1", {"type": "llm.delta", "requestId": "g1", "text": "a"}]]]


@pytest.mark.parametrize("number", [float("nan"), float("inf"), float("-inf")])
def test_an_envelope_that_is_not_json_never_costs_the_others_their_delivery(
    bridge: tuple[types.ModuleType, Host], number: float
) -> None:
    """The page parses a run's envelopes as one text: a NaN must not get into it.

    `send` refuses it (`ValueError`, so the shell answers `provider-error`),
    and the other envelopes of the run, to any endpoint, still arrive.
    """
    module, host = bridge
    transport = module.BridgeTransport(schedule=lambda _flush: None)
    transport.send("ep2", {"type": "llm.delta", "requestId": "g2", "sequence": 0})
    with pytest.raises(ValueError):
        transport.send("ep1", {"type": "llm.generate.result", "id": "g1", "usage": number})
    transport.send("ep2", {"type": "llm.generate.result", "id": "g2", "result": {}})
    transport.flush()
    assert host.batches == [
        [
            ["ep2", {"type": "llm.delta", "requestId": "g2", "sequence": 0}],
            ["ep2", {"type": "llm.generate.result", "id": "g2", "result": {}}],
        ]
    ]


def test_envelopes_still_arrive_when_the_hand_over_cannot_be_scheduled(
    bridge: tuple[types.ModuleType, Host],
) -> None:
    """A failed schedule must not leave the queue waiting for a flush that never comes."""
    module, host = bridge
    calls: list[Callable[[], None]] = []

    def schedule(flush: Callable[[], None]) -> None:
        calls.append(flush)
        if len(calls) == 1:
            raise RuntimeError("no microtask")

    transport = module.BridgeTransport(schedule=schedule)
    transport.send("ep1", {"type": "llm.delta", "requestId": "g1", "sequence": 0})
    transport.send("ep1", {"type": "llm.delta", "requestId": "g1", "sequence": 1})
    if len(calls) > 1:
        calls[-1]()
    transport.flush()
    delivered = [item for batch in host.batches for item in batch]
    assert delivered == [
        ["ep1", {"type": "llm.delta", "requestId": "g1", "sequence": 0}],
        ["ep1", {"type": "llm.delta", "requestId": "g1", "sequence": 1}],
    ]
    # And the next run is handed over again.
    transport.send("ep1", {"type": "llm.generate.result", "id": "g1", "result": {}})
    assert len(calls) >= 2
    calls[-1]()
    assert host.batches[-1] == [["ep1", {"type": "llm.generate.result", "id": "g1", "result": {}}]]
