"""Records (NAP-LLM, Schemas): strict parsing, every input class the spec names."""

from __future__ import annotations

import base64
import copy
from typing import Any

import pytest
from harness import PNG
from pydantic import ValidationError

from fixtures import WEATHER_TOOL
from napllm.connection_records import Capabilities
from napllm.errors import ErrorCode
from napllm.records import (
    Delta,
    Generation,
    ModelRecord,
    RecordError,
    decode_base64,
    parse_generation_request,
    parse_requirements,
)

JPEG = base64.b64encode(b"\xff\xd8\xff\xe0" + bytes(12)).decode()
WEBP = base64.b64encode(b"RIFF\x00\x00\x00\x00WEBPVP8 " + bytes(8)).decode()

PNG_PADDED = base64.b64encode(b"\x89PNG\r\n\x1a\n" + bytes(17)).decode()
assert PNG_PADDED.endswith("==")

VALID: dict[str, Any] = {
    "handle": "h1",
    "messages": [
        {"role": "system", "content": [{"type": "text", "text": "Be brief."}]},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "What is this?"},
                {"type": "image", "mimeType": "image/png", "data": PNG},
            ],
        },
    ],
    "format": "json",
    "maxTokens": 128,
    "temperature": 0.7,
    "tools": [WEATHER_TOOL],
    "toolChoice": "auto",
}


def mutate(path: list[Any], value: Any = None, *, delete: bool = False) -> dict[str, Any]:
    data = copy.deepcopy(VALID)
    node = data
    for key in path[:-1]:
        node = node[key]
    if delete:
        del node[path[-1]]
    else:
        node[path[-1]] = value
    return data


def rejects(data: Any) -> str:
    with pytest.raises(RecordError) as info:
        parse_generation_request(data)
    assert info.value.code is ErrorCode.INVALID_REQUEST
    return info.value.message


def test_valid_request_parses_with_every_field() -> None:
    request = parse_generation_request(VALID)
    assert request.maxTokens == 128
    assert request.output_format == "json"
    assert request.active_tools[0].name == "get_weather"


@pytest.mark.parametrize(
    "image",
    [("image/png", PNG), ("image/jpeg", JPEG), ("image/webp", WEBP)],
)
def test_each_declared_image_type_is_accepted(image: tuple[str, str]) -> None:
    data = mutate(
        ["messages", 1, "content", 1], {"type": "image", "mimeType": image[0], "data": image[1]}
    )
    parse_generation_request(data)


@pytest.mark.parametrize(
    ("path", "value"),
    [
        (["extra"], 1),
        (["messages", 0, "name"], "x"),
        (["messages", 1, "content", 0, "mimeType"], "image/png"),
        (["tools", 0, "strict"], True),
    ],
    ids=["request", "message", "part", "tool"],
)
def test_unknown_fields_are_invalid(path: list[Any], value: Any) -> None:
    assert "unknown field" in rejects(mutate(path, value))


@pytest.mark.parametrize(
    "path",
    [
        ["format"],
        ["maxTokens"],
        ["temperature"],
        ["tools"],
        ["toolChoice"],
        ["messages", 0, "content", 0, "text"],
        ["handle"],
    ],
)
def test_explicit_null_is_invalid(path: list[Any]) -> None:
    rejects(mutate(path, None))


def test_null_inside_schema_and_arguments_is_ordinary_json() -> None:
    tool = {"name": "t", "parameters": {"type": "object", "properties": {"a": {"default": None}}}}
    messages = [
        {"role": "user", "content": [{"type": "text", "text": "x"}]},
        {
            "role": "assistant",
            "content": [
                {"type": "toolCall", "toolCallId": "c1", "name": "t", "arguments": {"a": None}}
            ],
        },
        {
            "role": "toolResult",
            "toolCallId": "c1",
            "toolName": "t",
            "content": [{"type": "text", "text": "ok"}],
        },
    ]
    parse_generation_request({"handle": "h", "messages": messages, "tools": [tool]})


@pytest.mark.parametrize(
    ("path", "value"),
    [
        (["maxTokens"], "1"),
        (["maxTokens"], True),
        (["maxTokens"], 1.0),
        (["maxTokens"], 1.5),
        (["temperature"], "0.7"),
        (["temperature"], True),
        (["temperature"], float("nan")),
        (["temperature"], float("inf")),
        (["handle"], 1),
        (["messages"], {"role": "user"}),
        (["messages", 0, "content"], "text"),
        (["messages", 0, "content", 0, "text"], 5),
        (["tools"], {"name": "x"}),
        (["tools", 0, "parameters"], "object"),
        (["tools", 0, "description"], 3),
    ],
)
def test_wrong_types_are_not_coerced(path: list[Any], value: Any) -> None:
    rejects(mutate(path, value))


@pytest.mark.parametrize(
    ("path", "value"),
    [
        (["format"], "yaml"),
        (["messages", 0, "role"], "tool"),
        (["messages", 0, "content", 0, "type"], "video"),
        (["messages", 1, "content", 1, "mimeType"], "image/gif"),
        (["toolChoice"], "any"),
        (["toolChoice"], "tool"),
        (["toolChoice"], {"type": "function", "name": "get_weather"}),
    ],
)
def test_invalid_enum_values(path: list[Any], value: Any) -> None:
    rejects(mutate(path, value))


@pytest.mark.parametrize("value", [0, -1])
def test_max_tokens_below_one(value: int) -> None:
    assert "maxTokens" in rejects(mutate(["maxTokens"], value))


@pytest.mark.parametrize(
    "data",
    [
        PNG[:-1],  # bad padding
        PNG_PADDED.rstrip("="),  # missing padding
        PNG[:8] + "\n" + PNG[8:],  # whitespace
        PNG[:8] + " " + PNG[8:],
        "data:image/png;base64," + PNG,  # data-URI prefix
        "https://example.com/cat.png",  # remote URL
        PNG.replace("+", "-").replace("/", "_") + "-_",  # URL-safe alphabet
        "",  # empty
        "====",
    ],
    ids=[
        "bad-padding",
        "no-padding",
        "newline",
        "space",
        "data-uri",
        "url",
        "urlsafe",
        "empty",
        "pad-only",
    ],
)
def test_bad_base64_is_invalid(data: str) -> None:
    rejects(mutate(["messages", 1, "content", 1, "data"], data))


def test_image_bytes_must_match_mime_type() -> None:
    assert "mimeType" in rejects(mutate(["messages", 1, "content", 1, "mimeType"], "image/jpeg"))


def test_decode_base64_is_strict() -> None:
    assert decode_base64("QUJD") == b"ABC"
    assert decode_base64("QUI=") == b"AB"
    assert decode_base64("QUI") is None
    assert decode_base64("QU I=") is None


@pytest.mark.parametrize("name", ["", "a" * 65, "get weather", "wetter.heute", "ä", "a/b"])
def test_tool_names_outside_the_pattern(name: str) -> None:
    rejects(mutate(["tools", 0, "name"], name))


@pytest.mark.parametrize("name", ["a", "A" * 64, "get_weather-2"])
def test_tool_names_inside_the_pattern(name: str) -> None:
    data = mutate(["tools", 0, "name"], name)
    data["toolChoice"] = "auto"
    parse_generation_request(data)


def test_duplicate_tool_names() -> None:
    data = mutate(["tools"], [WEATHER_TOOL, dict(WEATHER_TOOL, description="again")])
    assert "unique" in rejects(data)


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "array"},
        {"properties": {}},
        {"type": ["object"]},
        {"type": "object", "properties": {"a": {"type": "strng"}}},
        {"type": "object", "minProperties": -1},
        {"type": "object", "required": "city"},
        {"type": "object", "properties": {"a": {"$ref": "#/$defs/missing"}}},
    ],
    ids=[
        "array-root",
        "no-type",
        "type-list",
        "bad-type",
        "negative",
        "required-not-list",
        "dangling-ref",
    ],
)
def test_parameters_must_be_a_valid_object_schema(schema: dict[str, Any]) -> None:
    rejects(mutate(["tools", 0, "parameters"], schema))


def test_json_schema_keywords_are_not_unknown_fields() -> None:
    schema = {
        "type": "object",
        "$defs": {"unit": {"enum": ["C", "F"]}},
        "properties": {
            "city": {"type": "string", "minLength": 1},
            "unit": {"$ref": "#/$defs/unit"},
        },
        "additionalProperties": False,
        "x-vendor-annotation": {"anything": True},
    }
    parse_generation_request(mutate(["tools", 0, "parameters"], schema))


def test_omitted_parameters_mean_the_empty_object_schema() -> None:
    data = mutate(["tools", 0], {"name": "ping"})
    data["toolChoice"] = "auto"
    tool = parse_generation_request(data).active_tools[0]
    assert tool.schema_or_default() == {
        "type": "object",
        "properties": {},
        "additionalProperties": False,
    }


@pytest.mark.parametrize(
    ("path", "value"),
    [(["messages"], []), (["messages", 0, "content"], []), (["handle"], "")],
)
def test_empty_where_non_empty_is_required(path: list[Any], value: Any) -> None:
    rejects(mutate(path, value))


def test_tool_result_needs_its_fields_and_others_may_not_have_them() -> None:
    message = {"role": "toolResult", "content": [{"type": "text", "text": "x"}]}
    rejects(mutate(["messages", 1], message))
    rejects(mutate(["messages", 1], {**message, "toolCallId": "c1"}))
    rejects(mutate(["messages", 0, "toolCallId"], "c1"))
    rejects(mutate(["messages", 0, "toolName"], "t"))


def test_not_an_object_at_all() -> None:
    for raw in (None, [], "request", 3):
        rejects(raw)


def test_errors_name_the_field_but_never_echo_values() -> None:
    secret = "sk-live-" + "9" * 24
    message = rejects(mutate(["messages", 0, "content", 0, "text"], {"secret": secret}))
    assert secret not in message
    assert "messages[0].content[0].text" in message


def test_requirements() -> None:
    assert parse_requirements({"model": "m", "json": True}).json_ is True
    for bad in (
        {"model": ""},
        {"json": 1},
        {"images": None},
        {"extra": True},
        {"tools": "yes"},
        [],
    ):
        with pytest.raises(RecordError):
            parse_requirements(bad)


def test_output_records_hold_their_invariants() -> None:
    call = {"type": "toolCall", "toolCallId": "c", "name": "t", "arguments": {}}
    with pytest.raises(ValueError):
        Generation.model_validate({"content": [call], "finish": "stop"})
    with pytest.raises(ValueError):
        Generation.model_validate({"content": [], "finish": "toolUse"})
    with pytest.raises(ValueError):
        Generation.model_validate({"content": [call], "finish": "length"})
    with pytest.raises(ValueError):
        Delta(requestId="g", sequence=0, event="start", block="toolCall", blockIndex=0)
    with pytest.raises(ValueError):
        Delta(requestId="g", sequence=0, event="delta", block="text", blockIndex=0)
    with pytest.raises(ValueError):
        ModelRecord.model_validate(
            {
                "handle": "h",
                "name": "n",
                "model": "m",
                "route": "r",
                "images": False,
                "json": False,
                "tools": True,
                "toolChoiceModes": ["auto"],
            }
        )


@pytest.mark.parametrize(
    ("tools", "modes"),
    [
        (True, ["auto"]),
        (True, ["none"]),
        (True, ["auto", "auto", "none"]),
        (True, ["required", "tool"]),
        (False, ["auto", "none"]),
    ],
)
def test_model_record_and_capabilities_refuse_the_same_tool_choice_modes(
    tools: bool, modes: list[str]
) -> None:
    # one rule (NAP-LLM, Model): a connection cannot claim what its Model record could not say
    with pytest.raises(ValidationError) as claimed:
        Capabilities(tools=tools, tool_choice_modes=tuple(modes))
    record = {"handle": "h", "name": "n", "model": "m", "route": "r", "images": False}
    with pytest.raises(ValidationError) as described:
        ModelRecord.model_validate(
            {**record, "json": False, "tools": tools, "toolChoiceModes": modes}
        )
    assert claimed.value.errors()[0]["msg"] == described.value.errors()[0]["msg"]
