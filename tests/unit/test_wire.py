"""Wire (NAP-LLM, Wire Protocol; NIP-5D): envelope parsing and result building."""

from __future__ import annotations

import json
from typing import Any

import pytest

from napllm.errors import ErrorCode, NapError
from napllm.intake import Cancel, Describe, Generate, Select, read_request
from napllm.records import Delta, Generation
from napllm.wire import (
    MAX_ID_LENGTH,
    Dropped,
    Envelope,
    Malformed,
    Unclonable,
    cancel_result,
    delta_envelope,
    error_result,
    generation_result,
    loads_strict,
    model_result,
    parse_envelope,
)

REQUEST = {
    "handle": "h1",
    "messages": [{"role": "user", "content": [{"type": "text", "text": "Hi"}]}],
}


def test_the_four_request_types_parse() -> None:
    assert read_request(
        {"type": "llm.select", "id": "s1", "requirements": {"json": True}}
    ) == Select(
        "s1",
        read_request(
            {"type": "llm.select", "id": "x", "requirements": {"json": True}}
        ).requirements,  # type: ignore[union-attr]
    )
    assert isinstance(read_request({"type": "llm.select", "id": "s1"}), Select)
    assert read_request({"type": "llm.describe", "id": "d1", "handle": "h1"}) == Describe(
        "d1", "h1"
    )
    assert isinstance(
        read_request({"type": "llm.generate", "id": "g1", "request": REQUEST}), Generate
    )
    assert read_request({"type": "llm.cancel", "id": "c1", "requestId": "g1"}) == Cancel("c1", "g1")


@pytest.mark.parametrize(
    "raw",
    [
        None,
        3,
        "llm.select",
        [],
        {},
        {"type": 5, "id": "x"},
        {"type": "llm.unknown", "id": "x"},
        {"type": "llm.select.result", "id": "x", "model": {}},
        {"type": "llm.delta", "requestId": "g1"},
        {"type": "shell.ready"},
        {"type": "LLM.SELECT", "id": "x"},
    ],
)
def test_unknown_or_non_envelopes_are_dropped_silently(raw: Any) -> None:
    assert isinstance(read_request(raw), Dropped)


@pytest.mark.parametrize(
    "rid", [None, 5, "", "x" * (MAX_ID_LENGTH + 1), "\ud800", ["g1"], {"id": "g1"}]
)
def test_known_type_without_usable_id_is_dropped(rid: Any) -> None:
    raw = {"type": "llm.generate", "request": REQUEST}
    if rid is not None:
        raw["id"] = rid
    parsed = read_request(raw)
    assert isinstance(parsed, Dropped) and parsed.reason == "no usable id"


def test_id_at_the_length_limit_is_usable() -> None:
    assert isinstance(
        read_request({"type": "llm.cancel", "id": "x" * MAX_ID_LENGTH, "requestId": "g"}), Cancel
    )


@pytest.mark.parametrize(
    "raw",
    [
        {"type": "llm.select", "id": "s1", "requirements": None},
        {"type": "llm.select", "id": "s1", "requirements": {"json": "yes"}},
        {"type": "llm.select", "id": "s1", "extra": 1},
        {"type": "llm.describe", "id": "d1"},
        {"type": "llm.describe", "id": "d1", "handle": ""},
        {"type": "llm.describe", "id": "d1", "handle": None},
        {"type": "llm.describe", "id": "d1", "handle": 7},
        {"type": "llm.generate", "id": "g1"},
        {"type": "llm.generate", "id": "g1", "request": None},
        {"type": "llm.generate", "id": "g1", "request": "prompt"},
        {"type": "llm.generate", "id": "g1", "request": {**REQUEST, "maxTokens": 0}},
        {"type": "llm.generate", "id": "g1", "request": REQUEST, "stream": True},
        {"type": "llm.cancel", "id": "c1"},
        {"type": "llm.cancel", "id": "c1", "requestId": ""},
        {"type": "llm.cancel", "id": "c1", "requestId": 3},
        {"type": "llm.generate", "id": "g1", "request": {**REQUEST, "temperature": float("nan")}},
        {"type": "llm.generate", "id": "g1", "request": {**REQUEST, "handle": "h\udc00"}},
        {"type": "llm.generate", "id": "g1", "request": {**REQUEST, 3: "x"}},
    ],
)
def test_malformed_known_type_with_usable_id(raw: dict[str, Any]) -> None:
    parsed = read_request(raw)
    assert isinstance(parsed, Malformed), parsed
    assert parsed.id == raw["id"] and parsed.type == raw["type"]
    assert parsed.error.code is ErrorCode.INVALID_REQUEST


def test_deep_nesting_is_invalid_not_a_crash() -> None:
    deep: Any = "x"
    for _ in range(200):
        deep = {"a": deep}
    request = {**REQUEST, "tools": [{"name": "t", "parameters": {"type": "object", "x": deep}}]}
    parsed = read_request({"type": "llm.generate", "id": "g1", "request": request})
    assert isinstance(parsed, Malformed)


def test_broken_conversation_is_invalid_request() -> None:
    request = {
        "handle": "h",
        "messages": [
            {
                "role": "toolResult",
                "toolCallId": "c1",
                "toolName": "t",
                "content": [{"type": "text", "text": "x"}],
            }
        ],
    }
    parsed = read_request({"type": "llm.generate", "id": "g1", "request": request})
    assert isinstance(parsed, Malformed) and parsed.error.code is ErrorCode.INVALID_REQUEST


def test_unclonable_messages() -> None:
    parsed = read_request(Unclonable("llm.generate", "g1"))
    assert isinstance(parsed, Malformed) and parsed.error.code is ErrorCode.INVALID_REQUEST
    parsed = read_request(Unclonable("llm.generate", "g1", too_large=True))
    assert isinstance(parsed, Malformed) and parsed.error.code is ErrorCode.QUOTA_EXCEEDED
    assert isinstance(read_request(Unclonable("llm.generate", None)), Dropped)
    assert isinstance(read_request(Unclonable("llm.other", "g1")), Dropped)
    assert isinstance(read_request(Unclonable(None, None)), Dropped)


def test_loads_strict() -> None:
    assert loads_strict('{"a": null}') == {"a": None}
    for text in ('{"a": NaN}', '{"a": Infinity}', '{"a": 1, "a": 2}', "{", ""):
        with pytest.raises(ValueError):
            loads_strict(text)


# -- outgoing envelopes: exactly the spec's examples ------------------------------

MODEL = {
    "handle": "h1",
    "name": "My connection",
    "model": "chosen-model",
    "route": "Local shell → inference provider",
    "images": False,
    "json": True,
    "tools": True,
    "toolChoiceModes": ["auto", "none", "required", "tool"],
}


def dumps(envelope: dict[str, Any]) -> str:
    return json.dumps(envelope, ensure_ascii=False, separators=(",", ":"))


def test_select_and_describe_results_match_the_spec_example() -> None:
    assert dumps(model_result("llm.select", "s1", MODEL)) == (
        '{"type":"llm.select.result","id":"s1","model":{"handle":"h1","name":"My connection",'
        '"model":"chosen-model","route":"Local shell → inference provider","images":false,'
        '"json":true,"tools":true,"toolChoiceModes":["auto","none","required","tool"]}}'
    )
    assert model_result("llm.describe", "d1", MODEL)["type"] == "llm.describe.result"


def test_generate_result_and_deltas_match_the_spec_example() -> None:
    deltas = [
        Delta(requestId="g1", sequence=0, event="start", block="text", blockIndex=0),
        Delta(
            requestId="g1",
            sequence=1,
            event="delta",
            block="text",
            blockIndex=0,
            text='{"greeting":"Hello"}',
        ),
        Delta(requestId="g1", sequence=2, event="end", block="text", blockIndex=0),
    ]
    assert [dumps(delta_envelope(d)) for d in deltas] == [
        '{"type":"llm.delta","requestId":"g1","sequence":0,"event":"start","block":"text","blockIndex":0}',
        '{"type":"llm.delta","requestId":"g1","sequence":1,"event":"delta","block":"text","blockIndex":0,"text":"{\\"greeting\\":\\"Hello\\"}"}',
        '{"type":"llm.delta","requestId":"g1","sequence":2,"event":"end","block":"text","blockIndex":0}',
    ]
    generation = Generation.model_validate(
        {
            "content": [{"type": "text", "text": '{"greeting":"Hello"}'}],
            "finish": "stop",
            "usage": {"inputTokens": 12, "outputTokens": 7},
        }
    )
    assert dumps(generation_result("g1", generation)) == (
        '{"type":"llm.generate.result","id":"g1","result":{"content":[{"type":"text",'
        '"text":"{\\"greeting\\":\\"Hello\\"}"}],"finish":"stop","usage":{"inputTokens":12,"outputTokens":7}}}'
    )


def test_tool_call_delta_start_matches_the_spec_example() -> None:
    delta = Delta(
        requestId="g2",
        sequence=0,
        event="start",
        block="toolCall",
        blockIndex=0,
        toolCallId="call_1",
        name="get_weather",
    )
    assert dumps(delta_envelope(delta)) == (
        '{"type":"llm.delta","requestId":"g2","sequence":0,"event":"start","block":"toolCall",'
        '"blockIndex":0,"toolCallId":"call_1","name":"get_weather"}'
    )


def test_cancel_and_error_results_match_the_spec_example() -> None:
    assert (
        dumps(cancel_result("c1", True))
        == '{"type":"llm.cancel.result","id":"c1","cancelled":true}'
    )
    assert dumps(error_result("llm.generate", "g2", NapError(ErrorCode.CANCELLED))) == (
        '{"type":"llm.generate.result","id":"g2","error":{"code":"cancelled",'
        '"message":"Generation cancelled; provider charges may still apply."}}'
    )
    assert dumps(error_result("llm.generate", "g7", NapError(ErrorCode.TIMEOUT))) == (
        '{"type":"llm.generate.result","id":"g7","error":{"code":"timeout",'
        '"message":"Generation deadline reached; provider charges may still apply."}}'
    )


def _nested_arguments(depth: int) -> dict[str, Any]:
    value: Any = 1
    for _ in range(depth - 1):
        value = [value]
    return {"d": value}


def _replay(arguments: dict[str, Any]) -> dict[str, Any]:
    call = {"type": "toolCall", "toolCallId": "c1", "name": "t", "arguments": arguments}
    messages = [
        {"role": "user", "content": [{"type": "text", "text": "x"}]},
        {"role": "assistant", "content": [call]},
        {
            "role": "toolResult",
            "toolCallId": "c1",
            "toolName": "t",
            "content": [{"type": "text", "text": "ok"}],
        },
    ]
    request = {"handle": "h", "messages": messages, "tools": [{"name": "t"}]}
    return {"type": "llm.generate", "id": "g1", "request": request}


def test_every_argument_object_a_provider_may_return_can_be_replayed() -> None:
    from napllm.jsontext import DEFAULT_MAX_DEPTH

    envelope = _replay(_nested_arguments(DEFAULT_MAX_DEPTH))
    assert isinstance(read_request(loads_strict(json.dumps(envelope))), Generate)


def test_envelopes_deeper_than_the_limit_get_invalid_request_with_their_id() -> None:
    from napllm.wire import MAX_DEPTH, PARSE_DEPTH

    envelope = _replay(_nested_arguments(MAX_DEPTH))  # arguments at depth 7: too deep
    parsed = read_request(loads_strict(json.dumps(envelope)))
    assert isinstance(parsed, Malformed) and parsed.id == "g1"
    assert parsed.error.code is ErrorCode.INVALID_REQUEST
    with pytest.raises(ValueError):
        loads_strict(
            '{"type":"llm.generate","id":"g1","x":' + "[" * PARSE_DEPTH + "]" * PARSE_DEPTH + "}"
        )
    with pytest.raises(ValueError):
        loads_strict("[" * 100_000)


def test_envelope_text_keeps_lone_surrogates_for_an_invalid_request_answer() -> None:
    raw = loads_strict('{"type":"llm.describe","id":"d1","handle":"h\\ud83d"}')
    parsed = read_request(raw)
    assert isinstance(parsed, Malformed) and parsed.id == "d1"
    assert "\ud83d" not in parsed.error.message


def test_the_envelope_stage_reads_no_record() -> None:
    # the pipeline's first stage checks the envelope only; records and the
    # conversation are later stages (intake.read_request)
    broken = {"handle": "h1", "messages": [{"role": "robot"}]}
    shaped = parse_envelope({"type": "llm.generate", "id": "g1", "request": broken})
    assert shaped == Envelope("llm.generate", "g1", {"request": broken})
    parsed = read_request({"type": "llm.generate", "id": "g1", "request": broken})
    assert isinstance(parsed, Malformed) and parsed.error.code == ErrorCode.INVALID_REQUEST
    # an envelope-level fault stops at the first stage
    shaped = parse_envelope({"type": "llm.generate", "id": "g1", "request": broken, "x": 1})
    assert isinstance(shaped, Malformed)
    assert shaped.error.message == "Invalid envelope: member 4 is an unknown field."
