"""NAP <-> LMSP translation (NAP-LLM Generation/Tool rules; LMSP 6.1-6.5)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from harness import FULL_CAPS, PNG

from fixtures import WEATHER_TOOL
from napllm.connection_records import Capabilities
from napllm.errors import ErrorCode, NapError, ProviderFailure
from napllm.lmsp import LmspEvent, Problem, failure_from_problem
from napllm.providers.fixture import (
    call_events,
    completed,
    incomplete,
    text_events,
    text_script,
    tool_call_script,
)
from napllm.records import GenerationRequest, parse_generation_request
from napllm.streaming import DeltaStream
from napllm.translate import (
    TOOL_FAILED_PREFIX,
    GenerationAssembler,
    check_supported,
    map_usage,
    nap_to_lmsp,
    tool_choice_mode,
)


def req(messages: list[dict[str, Any]] | None = None, **fields: Any) -> GenerationRequest:
    messages = messages or [{"role": "user", "content": [{"type": "text", "text": "Hi"}]}]
    return parse_generation_request({"handle": "h", "messages": messages, **fields})


WEATHER_HISTORY = [
    {"role": "system", "content": [{"type": "text", "text": "Be brief."}]},
    {"role": "user", "content": [{"type": "text", "text": "Weather in Berlin?"}]},
    {
        "role": "assistant",
        "content": [
            {"type": "thinking", "text": "SECRET-THOUGHT"},
            {"type": "text", "text": "Let me check."},
            {
                "type": "toolCall",
                "toolCallId": "call_1",
                "name": "get_weather",
                "arguments": {"city": "Berlin"},
            },
        ],
    },
    {
        "role": "toolResult",
        "toolCallId": "call_1",
        "toolName": "get_weather",
        "isError": True,
        "content": [
            {"type": "text", "text": "service down"},
            {"type": "text", "text": "retry later"},
        ],
    },
]


# -- NAP -> LMSP ----------------------------------------------------------------------


def test_messages_become_input_items_in_order() -> None:
    body = nap_to_lmsp(req(WEATHER_HISTORY, tools=[WEATHER_TOOL]), "m").to_json()
    assert body["model"] == "m" and body["stream"] is True
    assert body["input"] == [
        {
            "type": "message",
            "role": "system",
            "content": [{"type": "input_text", "text": "Be brief."}],
        },
        {
            "type": "message",
            "role": "user",
            "content": [{"type": "input_text", "text": "Weather in Berlin?"}],
        },
        {
            "type": "message",
            "role": "assistant",
            "content": [{"type": "input_text", "text": "Let me check."}],
        },
        {
            "type": "function_call",
            "call_id": "call_1",
            "name": "get_weather",
            "arguments": '{"city": "Berlin"}',
        },
        {
            "type": "function_call_output",
            "call_id": "call_1",
            "output": f"{TOOL_FAILED_PREFIX}\nservice down\nretry later",
        },
    ]
    assert "SECRET-THOUGHT" not in json.dumps(body)


def test_tool_result_without_error_has_no_prefix() -> None:
    history = [*WEATHER_HISTORY[:3], {**WEATHER_HISTORY[3], "isError": False}]
    out = nap_to_lmsp(req(history), "m").to_json()["input"][-1]["output"]
    assert out == "service down\nretry later"


def test_generation_controls_map() -> None:
    body = nap_to_lmsp(
        req(
            format="json",
            maxTokens=64,
            temperature=0.2,
            tools=[WEATHER_TOOL],
            toolChoice={"type": "tool", "name": "get_weather"},
        ),
        "m",
    ).to_json()
    assert body["max_output_tokens"] == 64
    assert body["temperature"] == 0.2
    assert body["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "json_object", "schema": {"type": "object"}},
    }
    assert body["tools"] == [{"type": "function", **WEATHER_TOOL}]
    assert body["tool_choice"] == {"type": "function", "name": "get_weather"}


def test_default_parameters_and_no_choice_without_tools() -> None:
    body = nap_to_lmsp(req(tools=[{"name": "ping"}]), "m").to_json()
    assert body["tools"][0]["parameters"] == {
        "type": "object",
        "properties": {},
        "additionalProperties": False,
    }
    assert "tool_choice" not in body
    assert "tools" not in nap_to_lmsp(req(tools=[]), "m").to_json()


def test_images_travel_as_extension_parts() -> None:
    messages = [
        {"role": "user", "content": [{"type": "image", "mimeType": "image/png", "data": PNG}]}
    ]
    lmsp = nap_to_lmsp(req(messages), "m")
    assert lmsp.uses_images()
    assert lmsp.to_json()["input"][0]["content"] == [
        {"type": "input_image", "mime_type": "image/png", "data": PNG}
    ]


# -- unsupported before submission ------------------------------------------------------

NO_CAPS = Capabilities()


@pytest.mark.parametrize(
    ("request_fields", "caps"),
    [
        (
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [{"type": "image", "mimeType": "image/png", "data": PNG}],
                    }
                ]
            },
            NO_CAPS,
        ),
        ({"format": "json"}, NO_CAPS),
        ({"tools": [WEATHER_TOOL]}, NO_CAPS),
        (
            {"tools": [WEATHER_TOOL], "toolChoice": "required"},
            Capabilities(tools=True, tool_choice_modes=("auto", "none")),
        ),
        (
            {"tools": [WEATHER_TOOL], "toolChoice": {"type": "tool", "name": "get_weather"}},
            Capabilities(tools=True, tool_choice_modes=("auto", "none", "required")),
        ),
        ({"temperature": 3.5}, NO_CAPS),
        ({"temperature": 0.5}, Capabilities(temperature=None)),
        ({"messages": WEATHER_HISTORY[1:]}, NO_CAPS),
        (
            {"messages": WEATHER_HISTORY[1:]},
            Capabilities(
                tools=True, tool_choice_modes=("auto", "none"), requires_reasoning_state=True
            ),
        ),
    ],
    ids=[
        "image",
        "json",
        "tools",
        "required-mode",
        "named-mode",
        "temperature-range",
        "no-temperature",
        "tool-history",
        "reasoning-state",
    ],
)
def test_unsupported_before_submission(request_fields: dict[str, Any], caps: Capabilities) -> None:
    with pytest.raises(NapError) as info:
        check_supported(req(**request_fields), caps)
    assert info.value.code is ErrorCode.UNSUPPORTED


def test_image_in_tool_result_needs_its_own_capability() -> None:
    history = [
        *WEATHER_HISTORY[1:3],
        {
            **WEATHER_HISTORY[3],
            "content": [{"type": "image", "mimeType": "image/png", "data": PNG}],
        },
    ]
    caps = Capabilities(images=True, tools=True, tool_choice_modes=("auto", "none"))
    with pytest.raises(NapError) as info:
        check_supported(req(history), caps)
    assert "tool results" in info.value.message
    check_supported(req(history), FULL_CAPS)


def test_default_auto_mode_needs_listing_and_everything_fits_full_caps() -> None:
    request = req(WEATHER_HISTORY, tools=[WEATHER_TOOL], format="json", temperature=1.0)
    assert tool_choice_mode(request) == "auto"  # absent toolChoice with tools is auto
    assert check_supported(request, FULL_CAPS) is None
    # a connection that does not list auto refuses it, and substitutes nothing
    # (built unchecked: the Capabilities validator refuses such a listing)
    no_auto = FULL_CAPS.model_copy(update={"tool_choice_modes": ("none",)})
    with pytest.raises(NapError) as info:
        check_supported(request, no_auto)
    assert info.value.code is ErrorCode.UNSUPPORTED
    assert info.value.message == "This connection does not support the tool choice mode auto."


# -- LMSP -> NAP ------------------------------------------------------------------------


class Collect:
    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []

    def __call__(self, envelope: dict[str, Any]) -> None:
        self.sent.append(envelope)


def run(request: GenerationRequest, events: list[Any]) -> tuple[Any, list[dict[str, Any]]]:
    sink = Collect()
    stream = DeltaStream("g1", sink)
    assembler = GenerationAssembler(request, stream)
    outcome: Any
    try:
        for event in events:
            if assembler.feed(event):
                break
        outcome = assembler.finish()
        stream.finish()
    except NapError as error:
        stream.abort()
        outcome = error
    except ProviderFailure as failure:  # a provider's failure event, as the shell maps it
        stream.abort()
        outcome = failure.to_nap_error()
    return outcome, sink.sent


def provider_error(outcome: Any) -> None:
    assert isinstance(outcome, NapError), outcome
    assert outcome.code is ErrorCode.PROVIDER_ERROR
    assert outcome.message == "The model provider failed or returned invalid output."


def check_blocks(deltas: list[dict[str, Any]]) -> dict[int, str]:
    """Lifecycle per block; returns the concatenated text per block index."""
    assert [d["sequence"] for d in deltas] == list(range(len(deltas)))
    state: dict[int, str] = {}
    text: dict[int, str] = {}
    for d in deltas:
        i = d["blockIndex"]
        if d["event"] == "start":
            assert i not in state
            state[i] = "open"
            text[i] = ""
        elif d["event"] == "delta":
            assert state[i] == "open"
            text[i] += d["text"]
        else:
            assert state[i] == "open"
            state[i] = "ended"
    return text


def test_text_stop() -> None:
    outcome, deltas = run(req(), text_script(["Hel", "lo!"]))
    assert outcome.finish == "stop"
    assert outcome.content[0].text == "Hello!"
    assert outcome.usage.inputTokens == 12
    assert check_blocks(deltas) == {0: "Hello!"}


@pytest.mark.parametrize("label", ["response.completed"])
def test_completed_call_is_tool_use(label: str) -> None:
    outcome, deltas = run(
        req(tools=[WEATHER_TOOL]), tool_call_script([("get_weather", {"city": "Berlin"}, "c9")])
    )
    assert outcome.finish == "toolUse"
    assert outcome.content[0].toolCallId == "c9"
    assert outcome.content[0].arguments == {"city": "Berlin"}
    assert json.loads(check_blocks(deltas)[0]) == {"city": "Berlin"}
    assert deltas[0]["toolCallId"] == "c9" and deltas[0]["name"] == "get_weather"


def test_missing_call_id_is_synthesised_once() -> None:
    outcome, deltas = run(
        req(tools=[WEATHER_TOOL]), tool_call_script([("get_weather", {"city": "Rome"}, None)])
    )
    call_id = outcome.content[0].toolCallId
    assert call_id.startswith("call_")
    assert deltas[0]["toolCallId"] == call_id


def test_synthesised_id_stays_when_done_brings_another() -> None:
    events = [
        *call_events(
            "get_weather", {"city": "Rome"}, call_id=None, fragments=['{"city":', '"Rome"}']
        )
    ]
    events[-1].data["item"]["call_id"] = "late_id"
    outcome, deltas = run(req(tools=[WEATHER_TOOL]), [*events, completed()])
    assert outcome.content[0].toolCallId == deltas[0]["toolCallId"] != "late_id"


def test_interleaved_calls_and_text() -> None:
    rid = "r"
    a = call_events("get_weather", {"city": "Berlin"}, call_id="c1", output_index=0)
    b = call_events("get_weather", {"city": "Paris"}, call_id="c2", output_index=1)
    # added a, added b, then b's done before a's done (interleaved)
    events = [a[0], b[0], b[-1], a[-1], completed(rid)]
    outcome, deltas = run(req(tools=[WEATHER_TOOL]), events)
    assert outcome.finish == "toolUse"
    assert [p.toolCallId for p in outcome.content] == ["c1", "c2"]
    texts = check_blocks(deltas)
    assert json.loads(texts[0]) == {"city": "Berlin"} and json.loads(texts[1]) == {"city": "Paris"}


def test_text_then_call_keeps_block_indices() -> None:
    events = [
        *text_events("Checking.", output_index=0),
        *call_events("get_weather", {"city": "Oslo"}, output_index=1),
        completed(),
    ]
    outcome, deltas = run(req(tools=[WEATHER_TOOL]), events)
    assert [p.type for p in outcome.content] == ["text", "toolCall"]
    assert check_blocks(deltas)[0] == "Checking."


def test_truncated_turn_drops_calls_and_keeps_finish() -> None:
    events = [
        *text_events("Partial", output_index=0),
        *call_events("get_weather", {"city": "Oslo"}, output_index=1),
        call_events("get_weather", '{"city": "Ro', output_index=2)[0],
        incomplete("max_output_tokens"),
    ]
    outcome, _ = run(req(tools=[WEATHER_TOOL]), events)
    assert outcome.finish == "length"
    assert [p.type for p in outcome.content] == ["text"]


def test_refusal() -> None:
    outcome, _ = run(
        req(tools=[WEATHER_TOOL]),
        [
            *call_events("get_weather", {"city": "Oslo"}, output_index=0),
            incomplete("content_filter"),
        ],
    )
    assert outcome.finish == "refusal" and outcome.content == []
    refusal_item = {
        "id": "m",
        "type": "message",
        "role": "assistant",
        "content": [{"type": "refusal", "refusal": "I cannot help with that."}],
    }
    events = [
        LmspEvent(
            event="response.output_item.added",
            data={"output_index": 0, "item": {**refusal_item, "content": []}},
        ),
        LmspEvent(
            event="response.output_item.done", data={"output_index": 0, "item": refusal_item}
        ),
        completed(),
    ]
    outcome, _ = run(req(), events)
    assert outcome.finish == "refusal"


@pytest.mark.parametrize(
    ("events", "fields"),
    [
        (text_script("x")[:-1], {}),  # no final event
        ([*text_events("x")[:-1], completed()], {}),  # item never completed
        (tool_call_script([("get_weather", "{not json", "c1")]), {"tools": [WEATHER_TOOL]}),
        (tool_call_script([("get_weather", "[1, 2]", "c1")]), {"tools": [WEATHER_TOOL]}),
        (tool_call_script([("get_time", {}, "c1")]), {"tools": [WEATHER_TOOL]}),
        (tool_call_script([("get_weather", {"city": "X"}, "c1")]), {}),  # no current tools
        (
            tool_call_script([("get_weather", {"city": "X"}, "c1")]),
            {"tools": [WEATHER_TOOL], "toolChoice": "none"},
        ),
        (text_script("plain"), {"tools": [WEATHER_TOOL], "toolChoice": "required"}),
        (
            text_script("plain"),
            {"tools": [WEATHER_TOOL], "toolChoice": {"type": "tool", "name": "get_weather"}},
        ),
        (
            tool_call_script([("get_weather", {}, "c1"), ("ping", {}, "c2")]),
            {
                "tools": [WEATHER_TOOL, {"name": "ping"}],
                "toolChoice": {"type": "tool", "name": "get_weather"},
            },
        ),
        (text_script("[1, 2]"), {"format": "json"}),
        (text_script("not json"), {"format": "json"}),
        ([LmspEvent(event="response.failed", data={"error": {"detail": "SECRET BODY"}})], {}),
        ([LmspEvent(event="error", data={"error": {"title": "boom"}})], {}),
        ([LmspEvent(event="response.cancelled", data={})], {}),
        (
            [LmspEvent(event="response.output_text.delta", data={"item_id": "nope", "delta": "x"})],
            {},
        ),
    ],
    ids=[
        "no-final",
        "never-done",
        "malformed-args",
        "array-args",
        "unknown-name",
        "no-tools",
        "choice-none",
        "choice-required",
        "choice-named-missing",
        "choice-named-other",
        "json-array",
        "json-text",
        "failed",
        "error-event",
        "provider-cancelled",
        "unknown-item",
    ],
)
def test_invalid_output_is_provider_error(events: list[Any], fields: dict[str, Any]) -> None:
    outcome, _ = run(req(**fields), events)
    provider_error(outcome)


def test_json_object_stop_is_accepted() -> None:
    outcome, _ = run(req(format="json"), text_script(['{"name": "Alice",', ' "age": 30}']))
    assert json.loads(outcome.content[0].text) == {"name": "Alice", "age": 30}


def test_streamed_text_contradicting_the_done_item() -> None:
    events = text_script(["Hello"])
    events[-2].data["item"]["content"][0]["text"] = "Goodbye"
    provider_error(run(req(), events)[0])


def test_done_item_extending_streamed_text_is_completed_not_lost() -> None:
    events = text_script(["Hel"])
    events[-2].data["item"]["content"][0]["text"] = "Hello!"
    outcome, deltas = run(req(), events)
    assert outcome.content[0].text == "Hello!" and check_blocks(deltas)[0] == "Hello!"


def test_unknown_events_and_items_are_ignored() -> None:
    events = text_script("ok")
    events.insert(1, LmspEvent(event="response.audio.delta", data={"x": 1}))
    events.insert(
        1,
        LmspEvent(
            event="response.output_item.added",
            data={"output_index": 5, "item": {"type": "web_search_call", "id": "w"}},
        ),
    )
    events.insert(
        2,
        LmspEvent(
            event="response.output_item.done",
            data={"output_index": 5, "item": {"type": "web_search_call", "id": "w"}},
        ),
    )
    outcome, _ = run(req(), events)
    assert outcome.finish == "stop" and outcome.content[0].text == "ok"


def test_reasoning_becomes_thinking() -> None:
    item = {"id": "rs", "type": "reasoning", "summary": []}
    done = {**item, "summary": [{"type": "summary_text", "text": "Think."}]}
    events = [
        LmspEvent(event="response.output_item.added", data={"output_index": 0, "item": item}),
        LmspEvent(
            event="response.reasoning_summary_text.delta", data={"item_id": "rs", "delta": "Think."}
        ),
        LmspEvent(event="response.output_item.done", data={"output_index": 0, "item": done}),
        *text_events("Answer.", output_index=1),
        completed(),
    ]
    outcome, deltas = run(req(), events)
    assert [(p.type, p.text) for p in outcome.content] == [
        ("thinking", "Think."),
        ("text", "Answer."),
    ]
    assert deltas[0]["block"] == "thinking"


def test_usage_mapping() -> None:
    usage = map_usage(
        {
            "input_tokens": 5,
            "output_tokens": 3,
            "total_tokens": 8,
            "input_tokens_details": {"cached_tokens": 2, "cache_write_tokens": 1},
            "output_tokens_details": {"reasoning_tokens": 4},
        }
    )
    assert usage is not None and usage.to_json() == {
        "inputTokens": 5,
        "outputTokens": 3,
        "cacheReadTokens": 2,
        "cacheWriteTokens": 1,
        "reasoningTokens": 4,
    }
    assert map_usage({"input_tokens": -1, "output_tokens": 1}) is None
    assert map_usage({"input_tokens": "5", "output_tokens": 1}) is None
    assert map_usage(None) is None


def test_problem_mapping() -> None:
    assert (
        failure_from_problem(None, Problem(code="unsupported_capability")).code
        is ErrorCode.UNSUPPORTED
    )
    ctx = failure_from_problem(None, Problem(code="context_length_exceeded", detail="SECRET"))
    assert ctx.code is ErrorCode.UNSUPPORTED and "SECRET" not in ctx.to_nap_error().message
    auth = failure_from_problem(401, Problem(code="unauthorized"))
    assert auth.code is ErrorCode.PROVIDER_ERROR and auth.user_hint
    assert (
        failure_from_problem(500, None).to_nap_error().message
        == "The model provider failed or returned invalid output."
    )


def test_problem_mapping_of_the_services_restart_codes() -> None:
    from napllm.lmsp import INTERRUPTED_HINT, MODEL_RESTARTED_HINT

    for status, code, hint in (
        (500, "model_crashed", MODEL_RESTARTED_HINT),
        (503, "model_unavailable", MODEL_RESTARTED_HINT),
        (503, "interrupted", INTERRUPTED_HINT),
    ):
        failure = failure_from_problem(status, Problem(code=code, detail="SECRET"))
        assert failure.code is ErrorCode.PROVIDER_ERROR
        assert failure.user_hint == hint
        assert "SECRET" not in failure.to_nap_error().message
    timeout = failure_from_problem(408, Problem(code="request_timeout"))
    assert timeout.code is ErrorCode.PROVIDER_ERROR and timeout.user_hint is None
