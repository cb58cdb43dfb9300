"""Delta blocks (NAP-LLM, Delta): lifecycle, contiguous sequence, coalescing."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from napllm.streaming import DeltaStream


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def make(interval: float = 0.0) -> tuple[DeltaStream, list[dict[str, Any]], Clock]:
    sent: list[dict[str, Any]] = []
    clock = Clock()
    return DeltaStream("g1", sent.append, interval_s=interval, monotonic=clock), sent, clock


def test_lifecycle_and_contiguous_sequence() -> None:
    stream, sent, _ = make()
    t = stream.start("text")
    c = stream.start("toolCall", tool_call_id="call_1", name="get_weather")
    stream.append(t, "Hel")
    stream.append(c, '{"city":')
    stream.append(t, "lo")
    stream.append(c, '"Berlin"}')
    stream.end(c)
    stream.end(t)
    stream.finish()
    assert [d["sequence"] for d in sent] == list(range(8))
    assert sent[1] == {
        "type": "llm.delta",
        "requestId": "g1",
        "sequence": 1,
        "event": "start",
        "block": "toolCall",
        "blockIndex": 1,
        "toolCallId": "call_1",
        "name": "get_weather",
    }
    assert stream.block_text(t) == "Hello" and stream.block_text(c) == '{"city":"Berlin"}'


def test_lifecycle_violations_raise() -> None:
    stream, _, _ = make()
    with pytest.raises(RuntimeError):
        stream.start("toolCall")
    with pytest.raises(RuntimeError):
        stream.start("text", tool_call_id="x", name="y")
    index = stream.start("text")
    stream.end(index)
    with pytest.raises(RuntimeError):
        stream.append(index, "late")
    with pytest.raises(RuntimeError):
        stream.end(index)
    with pytest.raises(RuntimeError):
        stream.append(7, "unknown")


async def test_slow_consumer_gets_fewer_larger_deltas_and_no_lost_text() -> None:
    stream, sent, clock = make(interval=0.05)
    index = stream.start("text")  # first flush is immediate
    words = [f"w{i} " for i in range(500)]
    for word in words:
        stream.append(index, word)  # all within the interval: coalesced
    clock.now = 1.0
    stream.end(index)
    stream.finish()
    deltas = [d for d in sent if d["event"] == "delta"]
    assert len(deltas) == 1
    assert "".join(d["text"] for d in deltas) == "".join(words)
    assert [d["sequence"] for d in sent] == list(range(len(sent)))


async def test_coalescing_skips_over_other_blocks_pending_events() -> None:
    stream, sent, clock = make(interval=1.0)
    a = stream.start("text")
    clock.now = 0.1
    b = stream.start("thinking")
    stream.append(a, "A1")
    stream.append(b, "B1")
    stream.append(a, "A2")
    clock.now = 5
    stream.flush()
    texts = {(d["blockIndex"]): d["text"] for d in sent if d["event"] == "delta"}
    assert texts == {0: "A1A2", 1: "B1"}
    assert len([d for d in sent if d["event"] == "delta"]) == 2


async def test_timer_flushes_pending_fragments() -> None:
    sent: list[dict[str, Any]] = []
    stream = DeltaStream("g1", sent.append, interval_s=0.01)
    index = stream.start("text")
    stream.append(index, "a")
    stream.append(index, "b")
    assert len(sent) == 1
    await asyncio.sleep(0.05)
    assert [d.get("text") for d in sent] == [None, "ab"]
    stream.finish()


async def test_abort_discards_pending_and_nothing_follows() -> None:
    stream, sent, clock = make(interval=10.0)
    index = stream.start("text")
    clock.now = 1
    stream.append(index, "pending")
    stream.abort()
    assert [d["event"] for d in sent] == ["start"]
    with pytest.raises(RuntimeError):
        stream.append(index, "late")
    stream.flush()
    assert len(sent) == 1


def test_empty_fragments_are_not_sent() -> None:
    stream, sent, _ = make()
    index = stream.start("text")
    stream.append(index, "")
    stream.end(index)
    assert [d["event"] for d in sent] == ["start", "end"]
