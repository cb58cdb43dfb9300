"""Delta blocks (NAP-LLM, Delta): lifecycle, contiguous sequence, coalescing."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from harness import ManualClock

from napllm.shell_ports import AsyncioClock
from napllm.streaming import DeltaStream


def make(interval: float = 0.0) -> tuple[DeltaStream, list[dict[str, Any]], ManualClock]:
    """A stream on a test clock: setting `now` fires nothing, `advance` fires due timers."""
    sent: list[dict[str, Any]] = []
    clock = ManualClock()
    return DeltaStream("g1", sent.append, interval_s=interval, clock=clock), sent, clock


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
    index = stream.start("text")
    words = [f"w{i} " for i in range(500)]
    for word in words:
        stream.append(index, word)  # the first goes at once, the rest within the interval
    clock.now = 1.0
    stream.end(index)
    stream.finish()
    deltas = [d for d in sent if d["event"] == "delta"]
    assert len(deltas) == 2
    assert "".join(d["text"] for d in deltas) == "".join(words)
    assert [d["sequence"] for d in sent] == list(range(len(sent)))


async def test_coalescing_skips_over_other_blocks_pending_events() -> None:
    stream, sent, clock = make(interval=1.0)
    a = stream.start("text")
    stream.append(a, "A0")  # sent at once with its start
    clock.now = 0.1
    b = stream.start("thinking")
    stream.append(a, "A1")
    stream.append(b, "B1")
    stream.append(a, "A2")
    clock.now = 5
    stream.flush()
    later = [d for d in sent[2:] if d["event"] == "delta"]
    assert {d["blockIndex"]: d["text"] for d in later} == {0: "A1A2", 1: "B1"}
    assert len(later) == 2


async def test_timer_flushes_pending_fragments() -> None:
    sent: list[dict[str, Any]] = []
    stream = DeltaStream("g1", sent.append, interval_s=0.01, clock=AsyncioClock())
    index = stream.start("text")
    stream.append(index, "a")
    stream.append(index, "b")
    stream.append(index, "c")
    assert len(sent) == 2
    await asyncio.sleep(0.05)
    assert [d.get("text") for d in sent] == [None, "a", "bc"]
    stream.finish()


async def test_abort_discards_pending_and_nothing_follows() -> None:
    stream, sent, _ = make(interval=10.0)
    index = stream.start("text")
    stream.append(index, "first")
    stream.append(index, "pending")
    stream.abort()
    assert [d.get("text") for d in sent] == [None, "first"]
    with pytest.raises(RuntimeError):
        stream.append(index, "late")
    stream.flush()
    assert len(sent) == 2


def test_empty_fragments_are_not_sent() -> None:
    stream, sent, _ = make()
    index = stream.start("text")
    stream.append(index, "")
    stream.end(index)
    assert [d["event"] for d in sent] == ["start", "end"]


async def test_first_fragment_travels_with_its_start() -> None:
    stream, sent, clock = make(interval=0.05)
    index = stream.start("text")
    assert sent == []  # the start waits for its first fragment
    stream.append(index, "Hello")
    assert [d["event"] for d in sent] == ["start", "delta"]
    clock.now = 0.001
    stream.append(index, " world")  # within the interval: coalesced, sent later
    assert len(sent) == 2
    stream.finish()
    assert [d.get("text") for d in sent] == [None, "Hello", " world"]


async def test_a_lone_start_is_sent_within_one_interval() -> None:
    sent: list[dict[str, Any]] = []
    stream = DeltaStream("g1", sent.append, interval_s=0.01, clock=AsyncioClock())
    stream.start("toolCall", tool_call_id="call_1", name="get_weather")
    assert sent == []
    await asyncio.sleep(0.05)
    assert [d["event"] for d in sent] == ["start"]
    stream.finish()


def test_envelopes_have_exactly_the_delta_record_shape() -> None:
    from napllm.records import Delta

    stream, sent, _ = make()
    t = stream.start("text")
    c = stream.start("toolCall", tool_call_id="call_1", name="f")
    stream.append(t, "x")
    stream.append(c, "{}")
    stream.end(t)
    stream.end(c)
    for envelope in sent:
        body = {k: v for k, v in envelope.items() if k != "type"}
        assert Delta.model_validate(body).to_json() == body


def test_coalescing_runs_on_the_clock_it_is_given() -> None:
    stream, sent, clock = make(interval=0.05)
    index = stream.start("text")
    stream.append(index, "a")
    stream.append(index, "b")
    stream.append(index, "c")
    assert [d.get("text") for d in sent] == [None, "a"]
    clock.advance(0.049)
    assert len(sent) == 2  # still cooling down
    clock.advance(0.001)
    assert [d.get("text") for d in sent] == [None, "a", "bc"]
    clock.advance(1.0)  # the next cool-down ends with nothing pending
    stream.append(index, "d")  # so the next fragment goes at once
    assert [d.get("text") for d in sent] == [None, "a", "bc", "d"]
    stream.end(index)
    stream.finish()
    assert [d["sequence"] for d in sent] == list(range(5))


def test_a_positive_interval_needs_a_clock() -> None:
    with pytest.raises(ValueError):
        DeltaStream("g1", lambda envelope: None, interval_s=0.01)
