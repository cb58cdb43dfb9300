"""Chunk batches from the engines' workers: runs of text-only chunks are merged
(`providers.engines.merge_text_chunks`) without changing the text or what
the mapping makes of the other chunks."""

from __future__ import annotations

import json
from typing import Any

from napllm.providers.engines import merge_text_chunks
from napllm.providers.openai_chat import ChatStreamToLmsp


def text(t: str, **extra: Any) -> dict[str, Any]:
    return {
        "id": "c1",
        "object": "chat.completion.chunk",
        "choices": [{"index": 0, "delta": {"content": t, **extra}, "finish_reason": None}],
    }


def last(reason: str = "stop") -> dict[str, Any]:
    return {
        "id": "c1",
        "choices": [{"index": 0, "delta": {}, "finish_reason": reason}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 5, "total_tokens": 8},
    }


def mapped_text(chunks: list[Any], tools: bool = False) -> tuple[str, list[str]]:
    state = ChatStreamToLmsp(parse_tool_call_blocks=tools)
    events = [e for c in chunks for e in state.feed(c)] + list(state.finish())
    deltas = "".join(
        str(e.data.get("delta", "")) for e in events if e.event == "response.output_text.delta"
    )
    kinds = [e.event for e in events if not e.event.endswith(".delta")]
    return deltas, kinds


def test_a_run_of_text_chunks_becomes_one_chunk() -> None:
    batch = [text("1,", role="assistant"), text(" 2"), text(","), text(" 3.")]
    merged = merge_text_chunks(batch)
    assert len(merged) == 1
    assert merged[0]["choices"][0]["delta"] == {"content": "1, 2, 3.", "role": "assistant"}
    assert merged[0]["id"] == "c1"
    # The inputs are not modified.
    assert batch[0]["choices"][0]["delta"]["content"] == "1,"


def test_other_chunks_stay_in_place_and_split_runs() -> None:
    tool = {
        "choices": [
            {
                "index": 0,
                "delta": {"tool_calls": [{"index": 0, "function": {"name": "f"}}]},
                "finish_reason": None,
            }
        ]
    }
    batch = [text("a"), text("b"), tool, text("c"), text("d"), last()]
    merged = merge_text_chunks(batch)
    assert [json.dumps(c, sort_keys=True) for c in merged] == [
        json.dumps(c, sort_keys=True)
        for c in [
            {**text("ab")},
            tool,
            text("cd"),
            last(),
        ]
    ]


def test_not_plain_chunks_pass_unchanged() -> None:
    odd: list[Any] = [
        "not a chunk",
        {"choices": []},
        {"choices": [{"index": 1, "delta": {"content": "x"}}]},
        {"choices": [{"index": 0, "delta": {"content": "x", "reasoning_content": "r"}}]},
        {"choices": [{"index": 0, "delta": {"content": "x"}, "logprobs": {"content": []}}]},
        {"choices": [{"index": 0, "delta": {"content": 3}}]},
        {"choices": [{"index": 0, "delta": {"content": "x"}}], "usage": {"total_tokens": 1}},
    ]
    assert merge_text_chunks(odd) == odd
    assert merge_text_chunks([]) == []


def test_merged_batches_map_to_the_same_text_and_items() -> None:
    pieces = ["Hel", "lo", " <tool", "_call>", '\n{"name": "f", "arguments": {}}', "\n</tool_call>"]
    chunks = [text(p) for p in pieces] + [last("tool_calls")]
    for tools in (False, True):
        one_by_one = mapped_text(chunks, tools)
        batched = mapped_text(merge_text_chunks(chunks), tools)
        assert batched == one_by_one
