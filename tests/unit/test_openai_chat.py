"""The OpenAI chat mapping (`chat_request`, `chat_stream`): requests, real engines, quirks."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fixtures import WEATHER_FUNCTION, lmsp_request, text_of
from napllm.errors import ErrorCode, ProviderFailure
from napllm.lmsp import LmspEvent, LmspRequest
from napllm.providers.chat_fields import usage_to_lmsp
from napllm.providers.chat_request import lmsp_to_chat
from napllm.providers.chat_stream import ChatStreamToLmsp, chat_response_to_lmsp
from toolcall_cases import MALFORMED, UNKNOWN_TOOL, WELL_FORMED, block


def request(**fields: Any) -> LmspRequest:
    return lmsp_request("m", **fields)


# --------------------------------------------------------------------------
# request mapping


def test_plain_request() -> None:
    body = lmsp_to_chat(request(stream=True, max_output_tokens=64, temperature=0.5))
    assert body == {
        "model": "m",
        "messages": [{"role": "user", "content": "Hi"}],
        "stream": True,
        "stream_options": {"include_usage": True},
        "max_tokens": 64,
        "temperature": 0.5,
    }


def test_non_streamed_request_asks_no_stream_options() -> None:
    body = lmsp_to_chat(request())
    assert body["stream"] is False
    assert "stream_options" not in body
    assert "max_tokens" not in body and "temperature" not in body


def test_roles_text_parts_images_and_replayed_tool_calls() -> None:
    req = request(
        input=[
            {
                "type": "message",
                "role": "system",
                "content": [{"type": "input_text", "text": "Be brief."}],
            },
            {
                "type": "message",
                "role": "user",
                "content": [
                    {"type": "input_text", "text": "Look:"},
                    {"type": "input_image", "mime_type": "image/png", "data": "iVBORw0KGgo="},
                ],
            },
            {
                "type": "message",
                "role": "assistant",
                "content": [{"type": "output_text", "text": "Checking."}],
            },
            {
                "type": "function_call",
                "call_id": "c1",
                "name": "get_weather",
                "arguments": '{"city":"Berlin"}',
            },
            {
                "type": "function_call",
                "call_id": "c2",
                "name": "get_weather",
                "arguments": '{"city":"Rome"}',
            },
            {"type": "function_call_output", "call_id": "c2", "output": "sunny"},
            {"type": "function_call_output", "call_id": "c1", "output": "rain"},
            {"type": "function_call", "call_id": "c3", "name": "get_weather", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c3", "output": "Tool execution failed."},
            {
                "type": "message",
                "role": "user",
                "content": [
                    {"type": "input_text", "text": "a"},
                    {"type": "input_text", "text": "b"},
                ],
            },
        ]
    )
    messages = lmsp_to_chat(req)["messages"]
    assert messages == [
        {"role": "system", "content": "Be brief."},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "Look:"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}},
            ],
        },
        {
            "role": "assistant",
            "content": "Checking.",
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city":"Berlin"}'},
                },
                {
                    "id": "c2",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city":"Rome"}'},
                },
            ],
        },
        {"role": "tool", "tool_call_id": "c2", "content": "sunny"},
        {"role": "tool", "tool_call_id": "c1", "content": "rain"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": "c3",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": "{}"},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "c3", "content": "Tool execution failed."},
        {"role": "user", "content": "a\nb"},
    ]


def test_image_in_tool_result_becomes_parts() -> None:
    req = request(
        input=[
            {"type": "function_call", "call_id": "c1", "name": "shot", "arguments": "{}"},
            {
                "type": "function_call_output",
                "call_id": "c1",
                "output": "see image",
                "images": [{"type": "input_image", "mime_type": "image/jpeg", "data": "AAAA"}],
            },
        ]
    )
    tool = lmsp_to_chat(req)["messages"][1]
    assert tool["content"][1] == {
        "type": "image_url",
        "image_url": {"url": "data:image/jpeg;base64,AAAA"},
    }


def test_tools_and_tool_choice() -> None:
    body = lmsp_to_chat(request(tools=[WEATHER_FUNCTION], tool_choice="required"))
    assert body["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "parameters": WEATHER_FUNCTION["parameters"],
                "description": WEATHER_FUNCTION["description"],
            },
        }
    ]
    assert body["tool_choice"] == "required"
    named = lmsp_to_chat(
        request(tools=[WEATHER_FUNCTION], tool_choice={"type": "function", "name": "get_weather"})
    )
    assert named["tool_choice"] == {"type": "function", "function": {"name": "get_weather"}}
    assert "tool_choice" not in lmsp_to_chat(request(tools=[WEATHER_FUNCTION]))


def test_response_format_styles() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    req = request(
        response_format={"type": "json_schema", "json_schema": {"name": "out", "schema": schema}}
    )
    assert lmsp_to_chat(req)["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "out", "schema": schema},
    }
    assert lmsp_to_chat(req, response_format_style="json_object")["response_format"] == {
        "type": "json_object"
    }
    assert lmsp_to_chat(req, response_format_style="json_object_schema")["response_format"] == {
        "type": "json_object",
        "schema": schema,
    }
    assert "response_format" not in lmsp_to_chat(request(response_format={"type": "text"}))


# --------------------------------------------------------------------------
# output: helpers


def run(chunks: list[Any], **options: Any) -> list[LmspEvent]:
    state = ChatStreamToLmsp(**options)
    events: list[LmspEvent] = []
    for chunk in chunks:
        events.extend(state.feed(chunk))
    events.extend(state.finish())
    check_lifecycle(events)
    return events


def check_lifecycle(events: list[LmspEvent]) -> None:
    """Invariants every event sequence keeps: added -> deltas -> done, deltas add up."""
    assert all(e.id is None for e in events)
    if not events:
        return
    assert events[0].event == "response.created"
    rid = events[0].data["response_id"]
    assert all(e.data["response_id"] == rid for e in events)
    opened: dict[str, dict[str, Any]] = {}
    texts: dict[tuple[str, str, int], str] = {}
    indices: list[int] = []
    for event in events[1:]:
        data = event.data
        if event.event == "response.output_item.added":
            item = data["item"]
            assert item["id"] not in opened
            assert data["output_index"] == len(indices)
            indices.append(data["output_index"])
            opened[item["id"]] = item
        elif event.event.endswith(".delta"):
            assert data["item_id"] in opened
            key = (event.event, data["item_id"], data.get("content_index", 0))
            texts[key] = texts.get(key, "") + data["delta"]
        elif event.event == "response.output_item.done":
            item = data["item"]
            assert opened.pop(item["id"])["type"] == item["type"]
            if item["type"] == "function_call":
                streamed = texts.get(("response.function_call_arguments.delta", item["id"], 0), "")
                assert streamed == item["arguments"]
            elif item["type"] == "message":
                for n, part in enumerate(item["content"]):
                    kind = "output_text" if part["type"] == "output_text" else "refusal"
                    streamed = texts.get((f"response.{kind}.delta", item["id"], n), "")
                    assert streamed == part["text" if kind == "output_text" else "refusal"]
            elif item["type"] == "reasoning":
                streamed = texts.get(("response.reasoning_summary_text.delta", item["id"], 0), "")
                assert streamed == "".join(p["text"] for p in item["summary"])
    terminals = [e for e in events if e.terminal]
    if terminals:
        assert terminals == [events[-1]]
        assert not opened, "items left open at the terminal event"


def items(events: list[LmspEvent]) -> list[dict[str, Any]]:
    return [e.data["item"] for e in events if e.event == "response.output_item.done"]


def terminal(events: list[LmspEvent]) -> LmspEvent:
    assert events[-1].terminal
    return events[-1]


def chunk(
    delta: dict[str, Any] | None = None,
    finish: str | None = None,
    *,
    usage: dict[str, Any] | None = None,
    cid: str = "chatcmpl-1",
) -> dict[str, Any]:
    out: dict[str, Any] = {
        "id": cid,
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "m",
        "choices": [{"index": 0, "delta": delta or {}, "finish_reason": finish}],
    }
    if usage is not None:
        out["usage"] = usage
    return out


def text_chunks(*pieces: str) -> list[dict[str, Any]]:
    return [chunk({"content": p}) for p in pieces]


# --------------------------------------------------------------------------
# text, finish reasons, usage


def test_text_stream_llama_cpp_python_shape() -> None:
    # llama-cpp-python server: role chunk, content chunks, empty finish chunk
    chunks = [chunk({"role": "assistant"}), *text_chunks("Hello", "!", " How"), chunk({}, "stop")]
    events = run(chunks)
    assert [e.event for e in events] == [
        "response.created",
        "response.output_item.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_item.done",
        "response.completed",
    ]
    assert items(events)[0]["content"] == [{"type": "output_text", "text": "Hello! How"}]
    assert terminal(events).data == {
        "response_id": events[0].data["response_id"],
        "status": "completed",
    }


@pytest.mark.parametrize(
    ("reason", "event", "details"),
    [
        ("stop", "response.completed", None),
        ("tool_calls", "response.completed", None),
        ("length", "response.incomplete", {"reason": "max_output_tokens"}),
        ("content_filter", "response.incomplete", {"reason": "content_filter"}),
        ("something_else", "response.failed", None),
    ],
)
def test_finish_reasons(reason: str, event: str, details: dict[str, str] | None) -> None:
    last = terminal(run([*text_chunks("x"), chunk({}, reason)]))
    assert last.event == event
    if details is not None:
        assert last.data["incomplete_details"] == details
    if event == "response.failed":
        assert last.data["error"]["code"] == "provider_error"


def test_stream_without_finish_reason_has_no_terminal_event() -> None:
    events = run(text_chunks("Hel", "lo"))
    assert not any(e.terminal for e in events)
    assert not any(e.event == "response.output_item.done" for e in events)


def test_no_chunks_no_events() -> None:
    assert run([]) == []


def test_usage_from_the_last_chunk_openai_shape() -> None:
    usage = {
        "prompt_tokens": 12,
        "completion_tokens": 7,
        "total_tokens": 19,
        "prompt_tokens_details": {"cached_tokens": 4},
        "completion_tokens_details": {"reasoning_tokens": 2},
    }
    # OpenAI / WebLLM / Ollama: finish chunk, then a choices-less usage chunk
    events = run(
        [*text_chunks("ok"), chunk({}, "stop"), {"id": "x", "choices": [], "usage": usage}]
    )
    assert terminal(events).data["usage"] == {
        "input_tokens": 12,
        "output_tokens": 7,
        "total_tokens": 19,
        "input_tokens_details": {"cached_tokens": 4},
        "output_tokens_details": {"reasoning_tokens": 2},
    }


def test_usage_later_chunk_wins_and_bad_usage_is_ignored() -> None:
    first = {"prompt_tokens": 1, "completion_tokens": 1}
    last = {"prompt_tokens": 3, "completion_tokens": 5}
    events = run([chunk({"content": "a"}, usage=first), chunk({}, "stop", usage=last)])
    assert terminal(events).data["usage"] == {
        "input_tokens": 3,
        "output_tokens": 5,
        "total_tokens": 8,
    }
    assert usage_to_lmsp({"prompt_tokens": -1, "completion_tokens": 2}) is None
    assert usage_to_lmsp({"prompt_tokens": True, "completion_tokens": 2}) is None
    assert usage_to_lmsp("lots") is None
    events = run([chunk({"content": "a"}, "stop", usage={"prompt_tokens": "many"})])
    assert "usage" not in terminal(events).data


def test_reasoning_content_then_text() -> None:
    chunks = [
        chunk({"reasoning_content": "Think"}),
        chunk({"reasoning_content": "ing."}),
        chunk({"content": "Answer"}),
        chunk({}, "stop"),
    ]
    events = run(chunks)
    done = items(events)
    assert done[0]["type"] == "reasoning"
    assert done[0]["summary"] == [{"type": "summary_text", "text": "Thinking."}]
    assert done[1]["content"] == [{"type": "output_text", "text": "Answer"}]
    deltas = [e for e in events if e.event == "response.reasoning_summary_text.delta"]
    assert [d.data["delta"] for d in deltas] == ["Think", "ing."]
    assert deltas[0].data["summary_index"] == 0


def test_ollama_reasoning_field() -> None:
    done = items(run([chunk({"reasoning": "hmm"}), chunk({"content": "ok"}, "stop")]))
    assert [i["type"] for i in done] == ["reasoning", "message"]


def test_refusal_becomes_a_refusal_part() -> None:
    events = run([chunk({"refusal": "I can't "}), chunk({"refusal": "help."}), chunk({}, "stop")])
    assert items(events)[0]["content"] == [{"type": "refusal", "refusal": "I can't help."}]
    assert [e.event for e in events].count("response.refusal.delta") == 2


def test_text_then_refusal_are_two_parts_of_one_message() -> None:
    events = run(
        [chunk({"content": "Well"}), chunk({"refusal": "No."}), chunk({}, "content_filter")]
    )
    assert items(events)[0]["content"] == [
        {"type": "output_text", "text": "Well"},
        {"type": "refusal", "refusal": "No."},
    ]
    refusal = next(e for e in events if e.event == "response.refusal.delta")
    assert refusal.data["content_index"] == 1


# --------------------------------------------------------------------------
# tool calls: recorded shapes of real servers


def call_items(events: list[LmspEvent]) -> list[dict[str, Any]]:
    return [i for i in items(events) if i["type"] == "function_call"]


def test_llama_cpp_server_index_keyed_argument_fragments() -> None:
    # llama-server: id, type and name in the first fragment only
    chunks = [
        chunk({"role": "assistant", "content": None}),
        chunk(
            {
                "tool_calls": [
                    {
                        "index": 0,
                        "id": "aBcD",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": ""},
                    }
                ]
            }
        ),
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"city'}}]}),
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": '": "Berlin"'}}]}),
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": "}"}}]}),
        chunk({}, "tool_calls"),
        {"choices": [], "usage": {"prompt_tokens": 30, "completion_tokens": 9, "total_tokens": 39}},
    ]
    events = run(chunks)
    [call] = call_items(events)
    assert call["call_id"] == "aBcD"
    assert call["name"] == "get_weather"
    assert json.loads(call["arguments"]) == {"city": "Berlin"}
    added = next(e for e in events if e.event == "response.output_item.added")
    assert added.data["item"]["name"] == "get_weather"
    assert added.data["item"]["arguments"] == ""
    deltas = [
        e.data["delta"] for e in events if e.event == "response.function_call_arguments.delta"
    ]
    assert deltas == ['{"city', '": "Berlin"', "}"]
    assert terminal(events).event == "response.completed"


def test_lm_studio_parallel_calls_by_index_interleaved() -> None:
    chunks = [
        chunk(
            {
                "tool_calls": [
                    {"index": 0, "id": "1", "type": "function", "function": {"name": "get_weather"}}
                ]
            }
        ),
        chunk(
            {
                "tool_calls": [
                    {"index": 1, "id": "2", "type": "function", "function": {"name": "get_time"}}
                ]
            }
        ),
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"city":'}}]}),
        chunk({"tool_calls": [{"index": 1, "function": {"arguments": '{"zone":"CET"}'}}]}),
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": '"Rome"}'}}]}),
        chunk({}, "tool_calls"),
    ]
    calls = call_items(run(chunks))
    assert [(c["call_id"], c["name"], c["arguments"]) for c in calls] == [
        ("1", "get_weather", '{"city":"Rome"}'),
        ("2", "get_time", '{"zone":"CET"}'),
    ]


def test_ollama_whole_calls_sharing_index_zero_with_different_ids() -> None:
    chunks = [
        chunk(
            {
                "content": "",
                "tool_calls": [
                    {
                        "id": "call_a",
                        "index": 0,
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city":"Berlin"}'},
                    }
                ],
            }
        ),
        chunk(
            {
                "content": "",
                "tool_calls": [
                    {
                        "id": "call_b",
                        "index": 0,
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'},
                    }
                ],
            }
        ),
        chunk({"content": ""}, "tool_calls"),
    ]
    calls = call_items(run(chunks))
    assert [(c["call_id"], json.loads(c["arguments"])) for c in calls] == [
        ("call_a", {"city": "Berlin"}),
        ("call_b", {"city": "Paris"}),
    ]


def test_calls_sharing_an_index_without_ids_split_on_a_new_name() -> None:
    chunks = [
        chunk(
            {
                "tool_calls": [
                    {
                        "index": 0,
                        "function": {"name": "get_weather", "arguments": '{"city":"Oslo"}'},
                    }
                ]
            }
        ),
        chunk(
            {
                "tool_calls": [
                    {
                        "index": 0,
                        "function": {"name": "get_weather", "arguments": '{"city":"Rome"}'},
                    }
                ]
            }
        ),
        chunk({}, "tool_calls"),
    ]
    calls = call_items(run(chunks))
    assert [c["arguments"] for c in calls] == ['{"city":"Oslo"}', '{"city":"Rome"}']
    assert calls[0]["call_id"] != calls[1]["call_id"]


def test_repeated_name_with_incomplete_arguments_continues_the_call() -> None:
    chunks = [
        chunk(
            {
                "tool_calls": [
                    {"index": 0, "function": {"name": "get_weather", "arguments": '{"city":'}}
                ]
            }
        ),
        chunk(
            {
                "tool_calls": [
                    {"index": 0, "function": {"name": "get_weather", "arguments": '"Oslo"}'}}
                ]
            }
        ),
        chunk({}, "tool_calls"),
    ]
    [call] = call_items(run(chunks))
    assert call["arguments"] == '{"city":"Oslo"}'


def test_same_id_repeated_in_every_fragment_is_one_call() -> None:
    chunks = [
        chunk(
            {"tool_calls": [{"index": 0, "id": "x", "function": {"name": "f", "arguments": "{}"}}]}
        ),
        chunk(
            {"tool_calls": [{"index": 0, "id": "x", "function": {"name": "f", "arguments": ""}}]}
        ),
        chunk({}, "tool_calls"),
    ]
    assert len(call_items(run(chunks))) == 1


def test_empty_or_missing_ids_get_a_stable_synthesised_id() -> None:
    chunks = [
        chunk(
            {
                "tool_calls": [
                    {"index": 0, "id": "", "function": {"name": "get_weather", "arguments": ""}}
                ]
            }
        ),
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"city":"Oslo"}'}}]}),
        chunk(
            {"tool_calls": [{"index": 1, "function": {"name": "get_weather", "arguments": "{}"}}]}
        ),
        chunk({}, "tool_calls"),
    ]
    events = run(chunks)
    calls = call_items(events)
    ids = [c["call_id"] for c in calls]
    assert all(i.startswith("call_") and len(i) > 5 for i in ids)
    assert len(set(ids)) == 2
    added = [e.data["item"]["call_id"] for e in events if e.event == "response.output_item.added"]
    assert added == ids


def test_id_arriving_before_announcement_is_adopted() -> None:
    chunks = [
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": ""}}]}),
        chunk(
            {
                "tool_calls": [
                    {"index": 0, "id": "late", "function": {"name": "f", "arguments": "{}"}}
                ]
            }
        ),
        chunk({}, "tool_calls"),
    ]
    [call] = call_items(run(chunks))
    assert call["call_id"] == "late"


def test_arguments_as_an_object_are_serialised() -> None:
    chunks = [
        chunk(
            {"tool_calls": [{"function": {"name": "get_weather", "arguments": {"city": "Zürich"}}}]}
        ),
        chunk({}, "stop"),
    ]
    [call] = call_items(run(chunks))
    assert call["arguments"] == '{"city": "Zürich"}'


def test_malformed_arguments_pass_through_unchanged() -> None:
    chunks = [
        chunk(
            {
                "tool_calls": [
                    {
                        "index": 0,
                        "id": "c",
                        "function": {"name": "nope", "arguments": '{"city": "Ber'},
                    }
                ]
            }
        ),
        chunk(
            {
                "tool_calls": [
                    {"index": 1, "id": "d", "function": {"name": "f", "arguments": "[1, 2]"}}
                ]
            }
        ),
        chunk({}, "tool_calls"),
    ]
    calls = call_items(run(chunks))
    assert [(c["name"], c["arguments"]) for c in calls] == [
        ("nope", '{"city": "Ber'),
        ("f", "[1, 2]"),
    ]


def test_call_without_a_name_is_passed_through_at_the_end() -> None:
    chunks = [
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": "{}"}}]}),
        chunk({}, "tool_calls"),
    ]
    [call] = call_items(run(chunks))
    assert call["name"] == ""
    assert call["arguments"] == "{}"


def test_webllm_tool_calls_only_in_the_final_chunk_without_ids() -> None:
    # WebLLM streams the calls' raw JSON as content, then reports them (no id)
    raw = '[{"arguments": {"city": "Berlin"}, "name": "get_weather"}]'
    chunks = [
        *text_chunks(raw[:10], raw[10:30], raw[30:]),
        chunk(
            {
                "role": "assistant",
                "tool_calls": [
                    {
                        "index": 0,
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city": "Berlin"}'},
                    }
                ],
            },
            "tool_calls",
        ),
        {"id": "x", "choices": [], "usage": {"prompt_tokens": 40, "completion_tokens": 20}},
    ]
    events = run(chunks, tool_text_in_content=True)
    assert not any(e.event == "response.output_text.delta" for e in events)
    [call] = call_items(events)
    assert call["call_id"].startswith("call_")
    assert json.loads(call["arguments"]) == {"city": "Berlin"}
    assert terminal(events).data["usage"]["output_tokens"] == 20


def test_webllm_with_tools_but_a_plain_answer_keeps_the_text() -> None:
    chunks = [*text_chunks("Hello", " there"), chunk({"role": "assistant"}, "stop")]
    events = run(chunks, tool_text_in_content=True)
    assert items(events)[0]["content"] == [{"type": "output_text", "text": "Hello there"}]


def test_wllama_non_streamed_tool_calls_without_id() -> None:
    body = {
        "choices": [
            {
                "index": 0,
                "message": {
                    "role": "assistant",
                    "content": "",
                    "tool_calls": [
                        {
                            "type": "function",
                            "function": {"name": "get_weather", "arguments": '{"city": "Berlin"}'},
                        }
                    ],
                },
                "finish_reason": "tool_calls",
            }
        ],
        "usage": {"prompt_tokens": 71, "completion_tokens": 10, "total_tokens": 81},
    }
    events = chat_response_to_lmsp(body)
    check_lifecycle(events)
    [call] = call_items(events)
    assert call["name"] == "get_weather"
    assert call["call_id"].startswith("call_")
    assert terminal(events).data["usage"]["input_tokens"] == 71


def test_wllama_streamed_tool_call_with_empty_id_and_timings() -> None:
    # wllama 3 runs llama-server's chat code in WebAssembly: index-keyed
    # fragments, an empty id, extra members such as `timings`
    fragments = ['{"city"', ': "Berlin"}']
    chunks = [
        chunk({"role": "assistant", "content": None}),
        chunk(
            {
                "tool_calls": [
                    {
                        "index": 0,
                        "id": "",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": ""},
                    }
                ]
            }
        ),
        *[chunk({"tool_calls": [{"index": 0, "function": {"arguments": f}}]}) for f in fragments],
        {
            **chunk({}, "tool_calls"),
            "timings": {"prompt_n": 71, "predicted_n": 10},
            "usage": {"prompt_tokens": 71, "completion_tokens": 10, "total_tokens": 81},
        },
    ]
    events = run(chunks)
    [call] = call_items(events)
    assert call["call_id"].startswith("call_")
    assert json.loads(call["arguments"]) == {"city": "Berlin"}
    assert terminal(events).data["usage"]["total_tokens"] == 81


def test_non_streamed_text_response() -> None:
    body = {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "Hello! How"},
                "finish_reason": "length",
            }
        ],
        "usage": {"prompt_tokens": 10, "completion_tokens": 3, "total_tokens": 13},
    }
    events = chat_response_to_lmsp(body, response_id="resp_fixed")
    check_lifecycle(events)
    assert events[0].data["response_id"] == "resp_fixed"
    assert items(events)[0]["content"] == [{"type": "output_text", "text": "Hello! How"}]
    assert terminal(events).event == "response.incomplete"


def test_non_streamed_parallel_calls_numbered_by_position() -> None:
    body = {
        "choices": [
            {
                "message": {
                    "tool_calls": [
                        {"id": "a", "function": {"name": "f", "arguments": "{}"}},
                        {"id": "b", "function": {"name": "g", "arguments": {"x": 1}}},
                    ]
                },
                "finish_reason": "tool_calls",
            }
        ]
    }
    calls = call_items(chat_response_to_lmsp(body))
    assert [(c["call_id"], c["name"], c["arguments"]) for c in calls] == [
        ("a", "f", "{}"),
        ("b", "g", '{"x": 1}'),
    ]


@pytest.mark.parametrize(
    "body",
    [
        [],
        {"error": {"message": "secret-token-123 rejected", "type": "auth"}},
        {"error": "model 'x' not found"},
        {"choices": []},
        {"choices": "nope"},
        {"choices": [{"message": "text"}]},
    ],
)
def test_non_streamed_bad_bodies_raise_a_safe_failure(body: object) -> None:
    with pytest.raises(ProviderFailure) as info:
        chat_response_to_lmsp(body)
    assert info.value.code is ErrorCode.PROVIDER_ERROR
    assert "secret" not in str(info.value) and "secret" not in (info.value.detail or "")
    assert (
        info.value.to_nap_error().message == "The model provider failed or returned invalid output."
    )


# --------------------------------------------------------------------------
# Hermes-style <tool_call> blocks in the content


TINYCHAT_TOOL_TOKENS = [
    "<", "tool", "_", "call", ">", "\n", '{"', "name", '":', ' "', "get", "_", "weather", '",',
    ' "', "arguments", '":', ' {"', "city", '":', ' "', "Berlin", '"}}', "\n", "</", "tool", "_",
    "call", ">",
]  # fmt: skip


def test_tinychat_tool_call_block_becomes_a_function_call() -> None:
    # recorded from llama-cpp-python's server streaming TinyChat, token by token
    chunks = [chunk({"role": "assistant"}), *text_chunks(*TINYCHAT_TOOL_TOKENS), chunk({}, "stop")]
    events = run(chunks, parse_tool_call_blocks=True)
    assert not any(e.event == "response.output_text.delta" for e in events)
    [call] = call_items(events)
    assert call["name"] == "get_weather"
    assert json.loads(call["arguments"]) == {"city": "Berlin"}
    assert call["call_id"].startswith("call_")
    assert terminal(events).event == "response.completed"
    assert len(items(events)) == 1


def test_tool_call_block_without_parsing_is_plain_text() -> None:
    events = run([*text_chunks(*TINYCHAT_TOOL_TOKENS), chunk({}, "stop")])
    assert items(events)[0]["content"][0]["text"] == "".join(TINYCHAT_TOOL_TOKENS)


def test_text_around_blocks_and_two_blocks() -> None:
    block = '<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call>'
    content = "Let me check. " + block + "\n" + block.replace('"a": 1', '"a": 2') + "\n"
    for size in (1, 3, 7, len(content)):
        pieces = [content[i : i + size] for i in range(0, len(content), size)]
        events = run([*text_chunks(*pieces), chunk({}, "stop")], parse_tool_call_blocks=True)
        done = items(events)
        assert [i["type"] for i in done] == ["message", "function_call", "function_call"], size
        assert done[0]["content"] == [{"type": "output_text", "text": "Let me check. "}]
        assert [json.loads(i["arguments"]) for i in done[1:]] == [{"a": 1}, {"a": 2}]


def test_text_that_only_looks_like_a_tag_start_is_released() -> None:
    events = run(
        [*text_chunks("a <", "tool", " b < c"), chunk({}, "stop")], parse_tool_call_blocks=True
    )
    assert items(events)[0]["content"][0]["text"] == "a <tool b < c"
    # a held-back "<tool" at the very end is text too
    events = run([*text_chunks("x <tool_"), chunk({}, "stop")], parse_tool_call_blocks=True)
    assert items(events)[0]["content"][0]["text"] == "x <tool_"


def test_text_after_a_block_opens_a_new_message() -> None:
    content = '<tool_call>{"name": "f", "arguments": {}}</tool_call> Done.'
    done = items(run([*text_chunks(content), chunk({}, "stop")], parse_tool_call_blocks=True))
    assert [i["type"] for i in done] == ["function_call", "message"]
    assert done[1]["content"][0]["text"] == " Done."


def test_whitespace_only_answer_is_kept_without_calls() -> None:
    done = items(run([*text_chunks("  "), chunk({}, "stop")], parse_tool_call_blocks=True))
    assert done[0]["content"] == [{"type": "output_text", "text": "  "}]


@pytest.mark.parametrize(("body", "name", "arguments"), [c[1:] for c in WELL_FORMED],
                         ids=[c[0] for c in WELL_FORMED])  # fmt: skip
def test_well_formed_blocks_become_calls(body: str, name: str, arguments: str) -> None:
    # the shared table (tests/toolcall_cases.py), as the LMSP service reads it
    content = block(body)
    for size in (1, 5, len(content)):
        pieces = [content[i : i + size] for i in range(0, len(content), size)]
        events = run([*text_chunks(*pieces), chunk({}, "stop")], parse_tool_call_blocks=True)
        [call] = call_items(events)
        assert (call["name"], call["arguments"]) == (name, arguments)
        assert len(items(events)) == 1


@pytest.mark.parametrize(("body", "reason"), [c[1:] for c in MALFORMED],
                         ids=[c[0] for c in MALFORMED])  # fmt: skip
def test_malformed_block_is_a_provider_error(body: str, reason: str) -> None:
    # NAP-LLM, Tool: a malformed completed call is provider-error; the
    # failure's detail is the fixed reason, never the model's text
    for finish in ("stop", "length"):  # a closed block is a completed call either way
        with pytest.raises(ProviderFailure) as caught:
            run([*text_chunks("Sure. " + block(body)), chunk({}, finish)],
                parse_tool_call_blocks=True)  # fmt: skip
        assert caught.value.code == ErrorCode.PROVIDER_ERROR
        assert caught.value.detail == f"model output: {reason}"


def test_unknown_tool_in_a_block_is_left_to_the_translation() -> None:
    # the mapping does not know the offered tools; translate.py rejects the name
    body, _ = UNKNOWN_TOOL
    events = run([*text_chunks(block(body)), chunk({}, "stop")], parse_tool_call_blocks=True)
    assert call_items(events)[0]["name"] == "launch"


def test_unterminated_block_at_the_end_is_a_call_only_when_the_turn_completed() -> None:
    content = '<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n'
    events = run([*text_chunks(content), chunk({}, "stop")], parse_tool_call_blocks=True)
    [call] = call_items(events)
    assert (call["name"], json.loads(call["arguments"])) == ("f", {"a": 1})
    with pytest.raises(ProviderFailure):
        run([*text_chunks('<tool_call>\n{"name": "f", "argu'), chunk({}, "stop")],
            parse_tool_call_blocks=True)  # fmt: skip
    for cut in ("length", "content_filter"):
        truncated = run(
            [*text_chunks('Sure. <tool_call>\n{"name": "f", "argu'), chunk({}, cut)],
            parse_tool_call_blocks=True,
        )
        assert terminal(truncated).event == "response.incomplete"
        assert call_items(truncated) == []
        assert items(truncated)[0]["content"][0]["text"] == "Sure. "


# --------------------------------------------------------------------------
# error chunks and malformed chunks


def test_mid_stream_error_chunk_raises_without_echoing() -> None:
    state = ChatStreamToLmsp()
    state.feed(chunk({"content": "a"}))
    with pytest.raises(ProviderFailure) as info:
        state.feed({"error": {"message": "CUDA out of memory at /home/alice/secret", "code": 500}})
    assert "alice" not in repr(info.value.__dict__)


@pytest.mark.parametrize(
    "bad",
    [
        "data",
        {"choices": {"0": {}}},
        {"choices": ["x"]},
        {"choices": [{"delta": "x"}]},
        {"choices": [{"delta": {"content": 5}}]},
        {"choices": [{"delta": {"refusal": ["no"]}}]},
        {"choices": [{"delta": {"reasoning_content": 1}}]},
        {"choices": [{"delta": {"tool_calls": {"0": {}}}}]},
        {"choices": [{"delta": {"tool_calls": ["x"]}}]},
        {"choices": [{"delta": {"tool_calls": [{"function": "f"}]}}]},
        {"choices": [{"delta": {"tool_calls": [{"function": {"name": 1}}]}}]},
        {"choices": [{"delta": {}, "finish_reason": 1}]},
    ],
)
def test_malformed_chunks_raise_provider_error(bad: object) -> None:
    with pytest.raises(ProviderFailure) as info:
        ChatStreamToLmsp().feed(bad)
    assert info.value.code is ErrorCode.PROVIDER_ERROR


def test_other_choices_are_ignored_and_finish_is_idempotent() -> None:
    state = ChatStreamToLmsp()
    state.feed(
        {
            "choices": [
                {"index": 1, "delta": {"content": "other"}},
                {"index": 0, "delta": {"content": "mine"}},
            ]
        }
    )
    state.feed(chunk({}, "stop"))
    events = state.finish()
    assert state.finish() == []
    assert state.feed(chunk({"content": "late"})) == []
    assert items(events)[0]["content"][0]["text"] == "mine"


# --------------------------------------------------------------------------
# any chunking of the content yields the same output


_pieces = st.lists(
    st.one_of(
        st.text(alphabet='ab <>_/\n{}"', max_size=8),
        st.sampled_from(["<tool_call>", "</tool_call>", "<tool", "_call>", "</tool_c"]),
        st.builds(
            lambda city: (
                "<tool_call>"
                + json.dumps({"name": "f", "arguments": {"city": city}})
                + "</tool_call>"
            ),
            st.sampled_from(["Oslo", "Rome", "Zürich"]),
        ),
    ),
    max_size=8,
)


def _normalised(chunks: list[Any]) -> list[tuple[str, Any]]:
    """The items and terminal event of a run, or the failure's detail."""
    try:
        events = run(chunks, parse_tool_call_blocks=True)
    except ProviderFailure as failure:
        return [("failed", failure.detail)]
    out: list[tuple[str, Any]] = []
    for item in items(events):
        if item["type"] == "message":
            out.append(("message", item["content"]))
        else:
            out.append(("call", (item["name"], item["arguments"])))
    return [*out, ("end", terminal(events).event)]


@settings(max_examples=300, deadline=None)
@given(pieces=_pieces, data=st.data())
def test_any_chunking_of_the_content_gives_the_same_items(
    pieces: list[str], data: st.DataObject
) -> None:
    content = "".join(pieces)
    whole = _normalised([chunk({"content": content}), chunk({}, "stop")])
    cuts = sorted(data.draw(st.lists(st.integers(0, len(content)), max_size=12)))
    parts = [content[a:b] for a, b in zip([0, *cuts], [*cuts, len(content)], strict=True)]
    split = _normalised([*text_chunks(*parts), chunk({}, "stop")])
    assert split == whole
    # nothing of a well-formed block ever leaks into the text
    for kind, value in whole:
        if kind == "message":
            assert all("<tool_call>{" not in part["text"] for part in value)


# --------------------------------------------------------------------------
# arguments in many fragments: linear, and the same verdicts


def test_arguments_in_many_fragments_repeating_the_name_cost_linear_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Each fragment copied the whole arguments text, and each that repeated
    # the name parsed it whole: 50,000 fragments of 20 characters took 85 s,
    # these 5,000 about a minute.
    from napllm.providers import chat_fields

    parsed: list[int] = []
    real = chat_fields.read_json

    def counting(text: str, **options: Any) -> Any:
        parsed.append(len(text))
        return real(text, **options)

    monkeypatch.setattr(chat_fields, "read_json", counting)
    state = ChatStreamToLmsp(parse_tool_call_blocks=False)
    pieces = ['{"city":"'] + ['Oslo \\" }{ ] ' * 3] * 5_000 + ['"}']

    def fragment(text: str) -> dict[str, Any]:
        call = {"index": 0, "function": {"name": "get_weather", "arguments": text}}
        return chunk({"tool_calls": [call]})

    for piece in pieces:
        state.feed(fragment(piece))
    events = [*state.feed(chunk({}, "tool_calls")), *state.finish()]
    [call] = call_items(events)
    assert call["arguments"] == "".join(pieces)
    assert sum(parsed) <= 2 * len(call["arguments"])


ARGUMENT_TEXTS = [
    '{"city":"Oslo"}',
    ' {"a":[1,{"b":"}"}]} \n',
    '{"a":"\\"}"}',
    '{"a":"\\\\"}',
    '{"a":"\\\\"} x',
    '{"a":1}{"b":2}',
    '{"a":1',
    '{"a":1]}',
    "[1,2,[3]]",
    '"just a string"',
    '"\\"',
    "42",
    "true ",
    "1e400",
    "[" * 50 + "]" * 50,
    "",
    "   ",
    '{"a":"\ud800"}',
    '{"a":NaN}',
    "}",
]


@pytest.mark.parametrize("text", ARGUMENT_TEXTS)
def test_completeness_of_arguments_split_anywhere_is_the_strict_readers(text: str) -> None:
    from napllm.providers.chat_arguments import ArgumentsText
    from napllm.providers.chat_fields import is_complete_json as _is_complete_json

    expected = _is_complete_json(text)
    splits = [[text[:i], text[i:]] for i in range(len(text) + 1)] + [list(text)]
    for pieces in splits:
        arguments = ArgumentsText()
        for piece in pieces:
            arguments.append(piece)
            assert arguments.complete() == _is_complete_json(arguments.text), pieces
        assert arguments.complete() == expected
        assert arguments.text == text


def test_whitespace_before_any_text_costs_linear_time_and_is_bounded() -> None:
    # Held whitespace was grown with a copy (and stripped whole) per piece:
    # 40,000 fragments of 20 spaces took 53 s; and it was counted by no bound.
    import time

    from napllm.output_order import MAX_OUTPUT_CHARS

    state = ChatStreamToLmsp(parse_tool_call_blocks=True)
    started = time.perf_counter()
    for _ in range(40_000):
        state.feed(chunk({"content": " " * 20}))
    assert time.perf_counter() - started < 10
    events = [*state.feed(chunk({"content": "Hi"}, "stop")), *state.finish()]
    assert text_of(events) == " " * 800_000 + "Hi"
    state = ChatStreamToLmsp(parse_tool_call_blocks=True)
    with pytest.raises(ProviderFailure) as info:
        for _ in range(MAX_OUTPUT_CHARS // (1024 * 1024) + 1):
            state.feed(chunk({"content": " " * (1024 * 1024)}))
    assert info.value.code is ErrorCode.PROVIDER_ERROR


@pytest.mark.parametrize(
    ("opening", "tools_in_content", "field"),
    [("<tool_call>", False, "content"), ("", True, "content"), ("", False, "refusal")],
    ids=["open-block", "webllm-withheld", "refusal"],
)
def test_text_held_back_is_bounded(opening: str, tools_in_content: bool, field: str) -> None:
    # An open <tool_call> block, WebLLM's text held until its final chunk,
    # and refusal text reached no output bound: a server could fill memory
    # until the deadline.
    from napllm.output_order import MAX_OUTPUT_CHARS

    state = ChatStreamToLmsp(parse_tool_call_blocks=True, tool_text_in_content=tools_in_content)
    state.feed(chunk({"content": opening}))
    with pytest.raises(ProviderFailure) as info:
        for _ in range(MAX_OUTPUT_CHARS // (1024 * 1024) + 1):
            state.feed(chunk({field: "x" * (1024 * 1024)}))
    assert info.value.code is ErrorCode.PROVIDER_ERROR
