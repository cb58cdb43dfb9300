"""The scripted connection (providers/scripted.py): the script format and its errors,
and every kind of turn played through the shell like any provider's output."""

from __future__ import annotations

import json
from typing import Any

import pytest
from harness import Harness, generate

from fixtures import WEATHER_TOOL
from napllm.connections import ConnectionSpec
from napllm.providers.connection_kinds import route_for
from napllm.providers.scripted import (
    ErrorTurn,
    JsonTurn,
    ScriptedProvider,
    ScriptError,
    StallTurn,
    TextTurn,
    ToolCallsTurn,
    parse_script,
)

GOOD = """{
  "repeat": false,
  "capabilities": {"images": false, "json": true, "tools": true},
  "turns": [
    {"text": ["Hel", "lo!"], "delayMs": 0},
    {"json": {"greeting": "Hello"}},
    {"toolCalls": [{"name": "get_weather", "arguments": {"city": "Berlin"}}]},
    {"error": {"code": "quota-exceeded", "message": "Rate limited."}},
    {"text": "Thinking", "stall": true},
    {"text": "Cut", "finish": "length"}
  ]
}"""


def test_good_script_parses_every_kind() -> None:
    script = parse_script(GOOD)
    kinds = [type(t) for t in script.turns]
    assert kinds == [TextTurn, JsonTurn, ToolCallsTurn, ErrorTurn, StallTurn, TextTurn]
    assert script.capabilities.images is False
    assert script.capabilities.json_output is True
    assert script.repeat is False


def test_a_bare_list_is_a_script_with_all_capabilities() -> None:
    script = parse_script('[{"text": "Hi"}]')
    assert len(script.turns) == 1
    assert script.capabilities.images and script.capabilities.tools


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "the script is empty"),
        ('[{"text": "a"},]', "not valid JSON at line 1, column 16"),
        ('[\n  {"text": "a"}\n  {"text": "b"}\n]', "at line 3, column 3"),
        ('{"text": "a"}', "the script object has unknown key(s) text;"),
        ('{"repeat": true}', "the script object needs a turns list"),
        ("[]", "the script has no turns"),
        ('"hello"', "a script is a JSON list of turns"),
        ('[{"text": "a"}, 3]', "turns[1]: a turn must be a JSON object"),
        ('[{"delayMs": 5}]', "turns[0]: a turn needs one of text, json, toolCalls, error, stall"),
        ('[{"json": 1, "stall": true}]', "turns[0]: a turn has one kind; found json and stall"),
        ('[{"json": 1, "text": "a"}]', "turns[0]: a json turn cannot also have text"),
        ('[{"text": "a", "delay": 5}]', "turns[0].delay: Extra inputs are not permitted"),
        ('[{"text": "a", "delayMs": -1}]', "turns[0].delayMs: Input should be greater than"),
        ('[{"text": "a", "delayMs": 1.5}]', "turns[0].delayMs: Input should be a valid integer"),
        ('[{"text": "a", "finish": "done"}]', "turns[0].finish: Input should be 'stop' or"),
        ('[{"text": []}]', "turns[0].text"),
        ('[{"toolCalls": []}]', "turns[0].toolCalls: List should have at least 1 item"),
        ('[{"toolCalls": [{"arguments": {}}]}]', "turns[0].toolCalls[0].name: Field required"),
        (
            '[{"toolCalls": [{"name": "f", "arguments": "x=1"}]}]',
            "turns[0].toolCalls[0].arguments: Input should be a valid dictionary",
        ),
        ('[{"error": {"code": "timeout"}}]', "turns[0].error.code: Input should be"),
        ('[{"stall": false}]', "turns[0].stall: Input should be True"),
        ('{"turns": [{"text": "a"}], "repeat": 1}', "repeat: must be true or false"),
        (
            '{"turns": [{"text": "a"}], "capabilities": {"audio": true}}',
            "capabilities.audio: Extra inputs are not permitted",
        ),
        ('[{"text": "a", "text": "b"}]', "duplicate"),
    ],
)
def test_bad_scripts_say_where_and_why(text: str, message: str) -> None:
    with pytest.raises(ScriptError) as caught:
        parse_script(text)
    assert message in str(caught.value)


def test_errors_never_repeat_script_values() -> None:
    secret = "sk-live-0123456789"
    for text in (
        f'[{{"text": "a", "{secret}": 1}}]',
        f'[{{"toolCalls": [{{"name": "f", "arguments": "{secret}"}}]}}]',
        f'[{{"error": {{"code": "{secret}"}}}}]',
    ):
        with pytest.raises(ScriptError) as caught:
            parse_script(text)
        assert secret not in str(caught.value)


def test_connection_spec_needs_the_script_text() -> None:
    with pytest.raises(ValueError, match="script"):
        ConnectionSpec.model_validate({"name": "S", "kind": "scripted", "model": "scripted"})
    spec = ConnectionSpec.model_validate(
        {"name": "S", "kind": "scripted", "model": "scripted", "settings": {"script": "[]"}}
    )
    assert spec.kind == "scripted"
    assert "scripted responses" in route_for("scripted", {})


# --------------------------------------------------------------------------- through the shell


async def _harness(script: str) -> tuple[Harness, ScriptedProvider, str, str]:
    h = Harness()
    h.connect("sc")
    provider = ScriptedProvider(parse_script(script))
    h.providers["sc"] = provider  # type: ignore[assignment]
    ep = h.endpoint()
    handle = await h.select(ep)
    return h, provider, ep, handle


async def _run(h: Harness, ep: str, rid: str, handle: str, **fields: Any) -> dict[str, Any]:
    h.send(ep, generate(rid, handle, **fields))
    await h.settle()
    return h.results(ep, rid)[-1]


async def test_text_json_and_tool_turns_are_assembled_like_any_provider() -> None:
    h, provider, ep, handle = await _harness(GOOD)
    first = await _run(h, ep, "g1", handle)
    assert first["result"]["content"] == [{"type": "text", "text": "Hello!"}]
    assert first["result"]["finish"] == "stop"
    texts = [d.get("text") for d in h.deltas(ep, "g1") if d["event"] == "delta"]
    assert "".join(t for t in texts if t) == "Hello!"

    second = await _run(h, ep, "g2", handle, format="json")
    assert json.loads(second["result"]["content"][0]["text"]) == {"greeting": "Hello"}

    third = await _run(h, ep, "g3", handle, tools=[WEATHER_TOOL], toolChoice="auto")
    call = third["result"]["content"][0]
    assert call["type"] == "toolCall"
    assert call["name"] == "get_weather"
    assert call["arguments"] == {"city": "Berlin"}
    assert third["result"]["finish"] == "toolUse"

    fourth = await _run(h, ep, "g4", handle)
    assert fourth["error"]["code"] == "quota-exceeded"
    assert "Rate limited" not in json.dumps(fourth)  # the message is for the shell only
    assert provider.submissions == 4


async def test_stall_waits_until_cancelled_then_next_turn_plays() -> None:
    h, provider, ep, handle = await _harness(GOOD)
    provider.position = 4
    h.send(ep, generate("g5", handle))
    for _ in range(20):
        await __import__("asyncio").sleep(0)
    assert h.results(ep, "g5") == []
    h.send(ep, {"type": "llm.cancel", "id": "c1", "requestId": "g5"})
    await h.settle()
    assert h.results(ep, "g5")[-1]["error"]["code"] == "cancelled"
    assert h.results(ep, "c1")[-1]["cancelled"] is True
    assert provider.stopped == 1  # closed before its terminal event
    last = await _run(h, ep, "g6", handle)
    assert last["result"]["finish"] == "length"
    assert provider.stopped == 1
    assert last["result"]["content"] == [{"type": "text", "text": "Cut"}]


async def test_no_turn_left_is_a_provider_error_unless_repeat() -> None:
    h, _, ep, handle = await _harness('[{"text": "once"}]')
    assert (await _run(h, ep, "g1", handle))["result"]["content"][0]["text"] == "once"
    assert (await _run(h, ep, "g2", handle))["error"]["code"] == "provider-error"

    h, _, ep, handle = await _harness('{"turns": [{"text": "a"}, {"text": "b"}], "repeat": true}')
    got = [(await _run(h, ep, f"g{i}", handle))["result"]["content"][0]["text"] for i in range(3)]
    assert got == ["a", "b", "a"]


async def test_error_after_streamed_text_keeps_the_partial_text_provisional() -> None:
    h, _, ep, handle = await _harness('[{"text": ["par", "tial"], "error": {}}]')
    result = await _run(h, ep, "g1", handle)
    assert result["error"]["code"] == "provider-error"


async def test_each_request_is_reported_with_the_next_turn() -> None:
    seen: list[tuple[int, int | None]] = []
    h = Harness()
    h.connect("sc")
    provider = ScriptedProvider(
        parse_script('[{"text": "a"}, {"text": "b"}]'),
        on_request=lambda p: seen.append((p.submissions, p.next_turn)),
    )
    h.providers["sc"] = provider  # type: ignore[assignment]
    ep = h.endpoint()
    handle = await h.select(ep)
    assert provider.next_turn == 1
    await _run(h, ep, "g1", handle)
    await _run(h, ep, "g2", handle)
    assert (await _run(h, ep, "g3", handle))["error"]["code"] == "provider-error"
    assert seen == [(1, 2), (2, None), (3, None)]

    repeating = ScriptedProvider(parse_script('{"turns": [{"text": "a"}], "repeat": true}'))
    repeating.position = 1
    assert repeating.next_turn == 1
