"""Provider output through the runtime's translation: the events the network
providers produce are what `translate.GenerationAssembler` turns into NAP-LLM
deltas and a Generation (providers/base.py contract; NAP-LLM Generation, Delta).
"""

from __future__ import annotations

import json
from typing import Any

from napllm.errors import ErrorCode, NapError
from napllm.lmsp import LmspEvent, LmspResponse
from napllm.providers.chat_stream import ChatStreamToLmsp, chat_response_to_lmsp
from napllm.providers.lmsp_client import SeenEvents
from napllm.records import parse_generation_request
from napllm.streaming import DeltaStream
from napllm.translate import GenerationAssembler

WEATHER = {
    "name": "get_weather",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
}


def nap_request(tools: bool = False) -> Any:
    body: dict[str, Any] = {
        "handle": "h",
        "messages": [{"role": "user", "content": [{"type": "text", "text": "Hi"}]}],
    }
    if tools:
        body["tools"] = [WEATHER]
    return parse_generation_request(body)


def assemble(events: list[LmspEvent], tools: bool = False) -> tuple[Any, list[dict[str, Any]]]:
    sent: list[dict[str, Any]] = []
    stream = DeltaStream("g1", sent.append)
    assembler = GenerationAssembler(nap_request(tools), stream)
    try:
        for event in events:
            if assembler.feed(event):
                break
        result: Any = assembler.finish()
        stream.finish()
    except NapError as error:
        stream.abort()
        result = error
    return result, sent


def streamed(chunks: list[dict[str, Any]], **options: Any) -> list[LmspEvent]:
    state = ChatStreamToLmsp(**options)
    events: list[LmspEvent] = []
    for chunk in chunks:
        events.extend(state.feed(chunk))
    return events + state.finish()


def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    return {"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}


def block_texts(sent: list[dict[str, Any]]) -> dict[int, str]:
    texts: dict[int, str] = {}
    for delta in sent:
        if delta["event"] == "delta":
            texts[delta["blockIndex"]] = texts.get(delta["blockIndex"], "") + delta["text"]
    return texts


def test_text_stream_becomes_stop_with_matching_deltas() -> None:
    events = streamed([chunk({"content": "Hello"}), chunk({"content": "!"}), chunk({}, "stop")])
    generation, sent = assemble(events)
    assert generation.finish == "stop"
    assert [p.text for p in generation.content] == ["Hello!"]
    assert block_texts(sent) == {0: "Hello!"}


def test_hermes_block_becomes_a_tool_use_generation() -> None:
    content = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Berlin"}}\n</tool_call>'
    chunks = [chunk({"content": content[i : i + 3]}) for i in range(0, len(content), 3)]
    events = streamed([*chunks, chunk({}, "stop")], parse_tool_call_blocks=True)
    generation, sent = assemble(events, tools=True)
    assert generation.finish == "toolUse"
    (call,) = generation.content
    assert (call.name, call.arguments) == ("get_weather", {"city": "Berlin"})
    start = next(d for d in sent if d["event"] == "start")
    assert start["toolCallId"] == call.toolCallId and start["name"] == "get_weather"
    assert json.loads(block_texts(sent)[0]) == {"city": "Berlin"}


def test_index_keyed_fragments_and_synthesised_id_round_trip() -> None:
    chunks = [
        chunk({"tool_calls": [{"index": 0, "id": "", "function": {"name": "get_weather"}}]}),
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"city":'}}]}),
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": ' "Rome"}'}}]}),
        chunk({}, "tool_calls"),
    ]
    generation, sent = assemble(streamed(chunks), tools=True)
    (call,) = generation.content
    assert call.arguments == {"city": "Rome"}
    assert call.toolCallId.startswith("call_")
    assert next(d for d in sent if d["event"] == "start")["toolCallId"] == call.toolCallId


def test_length_keeps_text_and_drops_calls() -> None:
    events = streamed([chunk({"content": "Hel"}), chunk({}, "length")])
    generation, _ = assemble(events)
    assert generation.finish == "length"
    assert [p.text for p in generation.content] == ["Hel"]


def test_missing_finish_reason_is_a_provider_error() -> None:
    result, _ = assemble(streamed([chunk({"content": "Hel"})]))
    assert isinstance(result, NapError) and result.code is ErrorCode.PROVIDER_ERROR


def test_malformed_call_passed_through_is_rejected_by_the_translation() -> None:
    body = {
        "choices": [
            {
                "message": {
                    "tool_calls": [{"function": {"name": "get_weather", "arguments": "[1]"}}]
                },
                "finish_reason": "tool_calls",
            }
        ]
    }
    result, _ = assemble(chat_response_to_lmsp(body), tools=True)
    assert isinstance(result, NapError) and result.code is ErrorCode.PROVIDER_ERROR


def test_resume_from_a_final_response_completes_the_streamed_text() -> None:
    # an LMSP task resumed after 410: created, added and one delta were seen;
    # the rest comes from the final response object
    rid = "resp_1"
    item = {"id": "msg_1", "type": "message", "role": "assistant", "content": []}
    seen_events = [
        LmspEvent(
            id=1, event="response.created", data={"response_id": rid, "status": "in_progress"}
        ),
        LmspEvent(
            id=2,
            event="response.output_item.added",
            data={"response_id": rid, "output_index": 0, "item": item},
        ),
        LmspEvent(
            id=3,
            event="response.output_text.delta",
            data={"response_id": rid, "item_id": "msg_1", "delta": "Hello"},
        ),
    ]
    seen = SeenEvents()
    for event in seen_events:
        seen.note(event)
    final = LmspResponse.model_validate(
        {
            "id": rid,
            "status": "completed",
            "output": [{**item, "content": [{"type": "output_text", "text": "Hello there"}]}],
            "usage": {"input_tokens": 1, "output_tokens": 2},
        }
    )
    generation, sent = assemble(seen_events + seen.remaining(final))
    assert generation.finish == "stop"
    assert [p.text for p in generation.content] == ["Hello there"]
    assert block_texts(sent) == {0: "Hello there"}
