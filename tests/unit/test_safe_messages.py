"""Error messages never echo napplet-supplied text (NAP-LLM, Security Considerations).

Every error path of the wire, record and conversation layers is driven with a
canary string and a lone surrogate placed where a napplet controls text: keys
at every level, values of every field, enum values, names and ids. The
message must name the field by position or a fixed description, contain
neither the canary nor any surrogate, and encode as UTF-8.
"""

from __future__ import annotations

import copy
import re
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fixtures import WEATHER_TOOL
from napllm.intake import read_request
from napllm.wire import Malformed

CANARY = "CANARY-5e1d"
HOSTILE = [CANARY, "x\ud83d" + CANARY, "\udc00", CANARY + "\u202e"]

CALL = {"type": "toolCall", "toolCallId": "c1", "name": "get_weather", "arguments": {}}
RESULT = {
    "role": "toolResult",
    "toolCallId": "c1",
    "toolName": "get_weather",
    "content": [{"type": "text", "text": "18 C"}],
}
VALID: dict[str, Any] = {
    "type": "llm.generate",
    "id": "g1",
    "request": {
        "handle": "h1",
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "Hi"}]},
            {"role": "assistant", "content": [{"type": "text", "text": "ok"}, CALL]},
            RESULT,
        ],
        "tools": [WEATHER_TOOL],
        "toolChoice": "auto",
    },
}

#: Objects of a valid envelope, by path, where a key may be inserted.
OBJECTS: list[list[Any]] = [
    [],
    ["request"],
    ["request", "messages", 0],
    ["request", "messages", 0, "content", 0],
    ["request", "messages", 1, "content", 1],
    ["request", "messages", 2],
    ["request", "tools", 0],
]
#: Fields a napplet fills with text, by path.
VALUES: list[list[Any]] = [
    ["request", "messages", 0, "role"],
    ["request", "messages", 0, "content", 0, "type"],
    ["request", "messages", 1, "content", 1, "toolCallId"],
    ["request", "messages", 1, "content", 1, "name"],
    ["request", "messages", 2, "toolCallId"],
    ["request", "messages", 2, "toolName"],
    ["request", "tools", 0, "name"],
    ["request", "toolChoice"],
    ["request", "format"],
    ["request", "maxTokens"],
    ["request", "messages", 0, "content"],
    ["request", "tools", 0, "parameters", "type"],
]


def at(data: Any, path: list[Any]) -> Any:
    for key in path:
        data = data[key]
    return data


def assert_safe(envelope: dict[str, Any]) -> str:
    parsed = read_request(envelope)
    assert isinstance(parsed, Malformed), parsed
    message = parsed.error.message
    assert CANARY not in message
    assert re.search("[\ud800-\udfff\u202e]", message) is None
    message.encode("utf-8")
    return message


@pytest.mark.parametrize("hostile", HOSTILE, ids=["canary", "surrogate", "low", "bidi"])
@pytest.mark.parametrize("path", OBJECTS, ids=lambda p: "/".join(map(str, p)) or "envelope")
@pytest.mark.parametrize("value", [1, None], ids=["value", "null"])
def test_unknown_and_null_keys_are_named_by_position(
    path: list[Any], hostile: str, value: Any
) -> None:
    envelope = copy.deepcopy(VALID)
    at(envelope, path)[hostile] = value
    message = assert_safe(envelope)
    if path == [] or (value is not None and "\ud83d" not in hostile and "\udc00" not in hostile):
        assert "member" in message, message


@pytest.mark.parametrize("hostile", HOSTILE, ids=["canary", "surrogate", "low", "bidi"])
@pytest.mark.parametrize("path", VALUES, ids=lambda p: "/".join(map(str, p)))
def test_hostile_values_are_never_echoed(path: list[Any], hostile: str) -> None:
    envelope = copy.deepcopy(VALID)
    if path[1] == "tools" and path[-1] == "name":
        hostile += "!"  # the canary alone is a valid tool name
    at(envelope, path[:-1])[path[-1]] = hostile
    assert_safe(envelope)


def test_handle_with_a_lone_surrogate_is_not_echoed() -> None:
    envelope = copy.deepcopy(VALID)
    envelope["request"]["handle"] = "h\ud83d" + CANARY
    assert_safe(envelope)


def test_known_field_names_are_still_named() -> None:
    envelope = copy.deepcopy(VALID)
    envelope["request"]["maxTokens"] = "many " + CANARY
    assert assert_safe(envelope) == "Invalid request.maxTokens: must be an integer."
    envelope = copy.deepcopy(VALID)
    envelope["request"]["messages"][0][CANARY] = 1
    assert assert_safe(envelope) == "Invalid request.messages[0]: member 3 is an unknown field."
    envelope = copy.deepcopy(VALID)
    envelope[CANARY] = 1
    assert assert_safe(envelope) == "Invalid envelope: member 4 is an unknown field."


@settings(max_examples=60, deadline=None)
@given(
    path=st.sampled_from(OBJECTS),
    key=st.text(min_size=1, max_size=12).map(lambda t: t + CANARY),
    value=st.one_of(st.none(), st.integers(), st.text(max_size=5).map(lambda t: t + CANARY)),
)
def test_any_hostile_member_anywhere_is_not_echoed(path: list[Any], key: str, value: Any) -> None:
    envelope = copy.deepcopy(VALID)
    at(envelope, path)[key] = value
    assert_safe(envelope)
