"""Conversation rules (NAP-LLM, Message and Tool): placements and toolResult adjacency."""

from __future__ import annotations

from typing import Any

import pytest
from harness import PNG

from fixtures import WEATHER_TOOL
from napllm.conversation import validate_conversation
from napllm.errors import ErrorCode, NapError
from napllm.records import parse_generation_request


def u(text: str = "What is the weather in Berlin and Paris?") -> dict[str, Any]:
    return {"role": "user", "content": [{"type": "text", "text": text}]}


def a(
    *calls: tuple[str, str], text: str | None = None, thinking: str | None = None
) -> dict[str, Any]:
    content: list[dict[str, Any]] = []
    if thinking is not None:
        content.append({"type": "thinking", "text": thinking})
    if text is not None:
        content.append({"type": "text", "text": text})
    for call_id, name in calls:
        content.append(
            {
                "type": "toolCall",
                "toolCallId": call_id,
                "name": name,
                "arguments": {"city": "Berlin"},
            }
        )
    return {"role": "assistant", "content": content}


def r(call_id: str, name: str = "get_weather", **extra: Any) -> dict[str, Any]:
    return {
        "role": "toolResult",
        "toolCallId": call_id,
        "toolName": name,
        "content": extra.pop("content", [{"type": "text", "text": "18°C"}]),
        **extra,
    }


def check(messages: list[dict[str, Any]], **fields: Any) -> None:
    request = parse_generation_request({"handle": "h", "messages": messages, **fields})
    validate_conversation(request)


def rejects(messages: list[dict[str, Any]], **fields: Any) -> str:
    with pytest.raises(NapError) as info:
        check(messages, **fields)
    assert info.value.code is ErrorCode.INVALID_REQUEST
    return info.value.message


def test_parallel_calls_answered_in_any_order() -> None:
    check(
        [u(), a(("c1", "get_weather"), ("c2", "get_weather")), r("c2"), r("c1"), u("thanks")],
        tools=[WEATHER_TOOL],
    )


def test_multiple_rounds() -> None:
    check(
        [
            u(),
            a(("c1", "get_weather")),
            r("c1"),
            a(("c2", "get_weather"), text="and Paris"),
            r("c2"),
        ],
        tools=[WEATHER_TOOL],
    )


def test_missing_result_of_a_parallel_call() -> None:
    assert "no result" in rejects(
        [u(), a(("c1", "get_weather"), ("c2", "get_weather")), r("c1"), u("next")]
    )


def test_missing_result_at_the_end() -> None:
    rejects([u(), a(("c1", "get_weather"), ("c2", "get_weather")), r("c1")])
    rejects([u(), a(("c1", "get_weather"))])


def test_duplicate_result() -> None:
    assert "duplicate" in rejects([u(), a(("c1", "get_weather")), r("c1"), r("c1")])


def test_orphaned_result_without_a_call() -> None:
    assert "orphaned" in rejects([u(), r("c1")])


def test_result_for_a_call_of_an_earlier_turn() -> None:
    rejects([u(), a(("c1", "get_weather")), r("c1"), u("again"), r("c1")])


def test_result_not_immediately_after_the_assistant_turn() -> None:
    rejects([u(), a(("c1", "get_weather")), u("interjection"), r("c1")])


def test_result_answering_an_unknown_id() -> None:
    rejects([u(), a(("c1", "get_weather")), r("c9")])


def test_name_mismatched_result() -> None:
    assert "toolName" in rejects([u(), a(("c1", "get_weather")), r("c1", name="get_time")])


def test_call_ids_unique_across_the_conversation() -> None:
    rejects([u(), a(("c1", "get_weather")), r("c1"), a(("c1", "get_weather")), r("c1")])
    rejects([u(), a(("c1", "get_weather"), ("c1", "get_weather")), r("c1"), r("c1")])


@pytest.mark.parametrize("role", ["user", "system", "toolResult"])
def test_tool_call_only_in_assistant_messages(role: str) -> None:
    message: dict[str, Any] = {
        "role": role,
        "content": [
            {"type": "toolCall", "toolCallId": "c1", "name": "get_weather", "arguments": {}}
        ],
    }
    if role == "toolResult":
        message |= {"toolCallId": "c0", "toolName": "x"}
    rejects([u(), message])


@pytest.mark.parametrize("role", ["user", "system"])
def test_thinking_only_in_assistant_messages(role: str) -> None:
    rejects([{"role": role, "content": [{"type": "thinking", "text": "hmm"}]}])


@pytest.mark.parametrize("role", ["user", "system", "assistant"])
def test_is_error_only_on_tool_result(role: str) -> None:
    message = {"role": role, "content": [{"type": "text", "text": "x"}], "isError": False}
    assert "isError" in rejects([u(), message])


def test_tool_result_content_only_text_and_image() -> None:
    check(
        [
            u(),
            a(("c1", "get_weather")),
            r(
                "c1",
                content=[
                    {"type": "text", "text": "radar"},
                    {"type": "image", "mimeType": "image/png", "data": PNG},
                ],
            ),
        ],
        tools=[WEATHER_TOOL],
    )
    rejects([u(), a(("c1", "get_weather")), r("c1", content=[{"type": "thinking", "text": "x"}])])


def test_is_error_on_tool_result_is_fine() -> None:
    check([u(), a(("c1", "get_weather")), r("c1", isError=True)], tools=[WEATHER_TOOL])


def test_explicit_tool_choice_needs_tools() -> None:
    for choice in ("auto", "none", "required", {"type": "tool", "name": "get_weather"}):
        assert "toolChoice" in rejects([u()], toolChoice=choice)
        rejects([u()], toolChoice=choice, tools=[])


def test_forced_name_must_be_in_tools() -> None:
    assert "forced" in rejects(
        [u()], tools=[WEATHER_TOOL], toolChoice={"type": "tool", "name": "other"}
    )
    check([u()], tools=[WEATHER_TOOL], toolChoice={"type": "tool", "name": "get_weather"})


def test_history_without_current_tools_is_accepted() -> None:
    check([u(), a(("c1", "get_weather")), r("c1"), a(text="It is 18°C.")])


def test_thinking_in_assistant_history_is_accepted() -> None:
    check(
        [u(), a(("c1", "get_weather"), thinking="I should look it up."), r("c1")],
        tools=[WEATHER_TOOL],
    )
