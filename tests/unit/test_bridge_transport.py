"""The shell's transport in the page (napllm.browser.bridge.BridgeTransport).

Envelopes sent during one run of Python reach the page together, in order,
as one `napllmHost.postAll` call; the page posts each to its endpoint's frame.
"""

from __future__ import annotations

import importlib
import json
import sys
import types
from collections.abc import Callable, Iterator
from typing import Any

import pytest


class Host:
    """A stand-in for the page's `napllmHost`: records every batch."""

    def __init__(self) -> None:
        self.batches: list[Any] = []

    def postAll(self, text: str) -> None:
        self.batches.append(json.loads(text))


@pytest.fixture
def bridge() -> Iterator[tuple[types.ModuleType, Host]]:
    saved = {name: sys.modules.get(name) for name in ("js", "napllm.browser.bridge")}
    fake_js = types.ModuleType("js")
    host = Host()
    fake_js.napllmHost = host  # type: ignore[attr-defined]
    sys.modules["js"] = fake_js
    sys.modules.pop("napllm.browser.bridge", None)
    try:
        yield importlib.import_module("napllm.browser.bridge"), host
    finally:
        for name, module in saved.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module


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
