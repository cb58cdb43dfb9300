"""Hostile provider output: the strict reader, one surrogate rule, output order,
and exactly one terminal result whatever fails while settling.

Every provider (LMSP, OpenAI-compatible, WebLLM, wllama) ends in
`translate.GenerationAssembler` behind `shell.Shell`; these tests drive the real
shell through `harness.Harness` with scripted events (the fixture provider)
or with chat-completion chunks mapped by `chat_stream.ChatStreamToLmsp`, the
mapping every OpenAI-style engine path uses. docs/security.md, "Provider
output", names the fault kinds and points here.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from harness import Harness, generate
from napcheck import assert_safe_error, check_generation, ready, run

from fixtures import WEATHER_TOOL
from napllm import generations as generations_module
from napllm import output_order
from napllm import selections as selections_module
from napllm.errors import ErrorCode
from napllm.lmsp import LmspEvent
from napllm.providers.chat_stream import ChatStreamToLmsp
from napllm.providers.fixture import Fail, call_events, completed, incomplete
from napllm.shell import ShellPolicy
from napllm.streaming import DeltaStream

RID = "resp_fixture"
CREATED = LmspEvent(event="response.created", data={"response_id": RID, "status": "in_progress"})


def ev(name: str, **data: Any) -> LmspEvent:
    return LmspEvent(event=name, data={"response_id": RID, **data})


def message_added(index: int = 0, item_id: str = "msg_0") -> LmspEvent:
    item = {"id": item_id, "type": "message", "role": "assistant", "content": []}
    return ev("response.output_item.added", output_index=index, item=item)


def text_delta(delta: str, item_id: str = "msg_0") -> LmspEvent:
    return ev("response.output_text.delta", item_id=item_id, delta=delta)


def message_done(text: str, index: int = 0, item_id: str = "msg_0") -> LmspEvent:
    item = {
        "id": item_id,
        "type": "message",
        "role": "assistant",
        "content": [{"type": "output_text", "text": text}],
    }
    return ev("response.output_item.done", output_index=index, item=item)


def assert_clean(h: Harness, ep: str) -> None:
    """Everything sent encodes as strict UTF-8 JSON (no lone surrogate, no NaN)."""
    for envelope in h.out(ep):
        json.dumps(envelope, ensure_ascii=False, allow_nan=False).encode("utf-8")


async def cancel_is_false(h: Harness, ep: str, rid: str) -> None:
    h.send(ep, {"type": "llm.cancel", "id": "c-" + rid, "requestId": rid})
    await h.settle()
    [answer] = h.results(ep, "c-" + rid)
    assert answer["cancelled"] is False


def with_tools(rid: str, handle: str, **fields: Any) -> dict[str, Any]:
    return generate(rid, handle, tools=[WEATHER_TOOL], **fields)


# ==========================================================================
# A. The strict reader for provider JSON


DEEP_49 = '{"d":' + "[" * 49 + "1" + "]" * 49 + "}"
DEEP_10K = '{"d":' + "[" * 10_000 + "1" + "]" * 10_000 + "}"


@pytest.mark.parametrize(
    "arguments",
    [
        DEEP_49,
        DEEP_10K,
        '{"x":NaN}',
        '{"x":-Infinity}',
        '{"x":1e400}',
        '{"x":1,"x":2}',
        '{"x":9007199254740993}',
        '{"x":"\\ud83d"}',
    ],
    ids=["depth-50", "depth-10k", "nan", "-infinity", "1e400", "dup-key", "unsafe-int", "lone"],
)
async def test_tool_arguments_that_fail_the_strict_reader_are_provider_errors(
    arguments: str,
) -> None:
    h, fx, ep, handle = await ready()
    fx.queue([CREATED, *call_events("get_weather", arguments, fragments=[arguments]), completed()])
    result = await run(h, ep, with_tools("g1", handle))
    assert_safe_error(result, ErrorCode.PROVIDER_ERROR)
    assert_clean(h, ep)
    await cancel_is_false(h, ep, "g1")


async def test_arguments_at_the_depth_limit_still_reach_the_napplet() -> None:
    arguments = '{"d":' + "[" * 39 + "1" + "]" * 39 + "}"  # depth 40
    h, fx, ep, handle = await ready()
    fx.queue([CREATED, *call_events("get_weather", arguments), completed()])
    result = await run(h, ep, with_tools("g1", handle))
    assert result["result"]["finish"] == "toolUse"
    assert result["result"]["content"][0]["arguments"] == json.loads(arguments)


@pytest.mark.parametrize("answer", ['{"x":NaN}', '{"x":1e400}', DEEP_10K])
async def test_format_json_answers_that_fail_the_strict_reader_are_provider_errors(
    answer: str,
) -> None:
    h, fx, ep, handle = await ready()
    fx.queue([CREATED, message_added(), text_delta(answer), message_done(answer), completed()])
    result = await run(h, ep, generate("g1", handle, format="json"))
    assert_safe_error(result, ErrorCode.PROVIDER_ERROR)


# ==========================================================================
# A. Exactly one terminal result, whatever fails while settling


class FlakyTransport:
    """Raises for envelopes matching `fail(envelope)`; records the others."""

    def __init__(self, fail: Any) -> None:
        self.fail = fail
        self.sent: dict[str, list[dict[str, Any]]] = {}

    def send(self, endpoint_id: str, envelope: dict[str, Any]) -> None:
        if self.fail(envelope):
            raise RuntimeError("postMessage failed")
        self.sent.setdefault(endpoint_id, []).append(envelope)


async def flaky(fail: Any) -> tuple[Harness, Any, str, str]:
    h = Harness(policy=ShellPolicy(delta_interval_s=0.0))
    h.transport = FlakyTransport(fail)  # type: ignore[assignment]
    h.shell._transport = h.transport
    fx = h.connect()
    ep = h.endpoint()
    handle = await h.select(ep)
    return h, fx, ep, handle


def is_success_result(envelope: dict[str, Any]) -> bool:
    return envelope["type"] == "llm.generate.result" and "result" in envelope


async def test_building_the_result_fails_gives_provider_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def broken(rid: str, generation: Any) -> dict[str, Any]:
        raise ValueError("Maximum serialization depth exceeded")

    monkeypatch.setattr(generations_module, "generation_result", broken)
    h, _fx, ep, handle = await ready()
    result = await run(h, ep, generate("g1", handle))
    assert_safe_error(result, ErrorCode.PROVIDER_ERROR)
    await cancel_is_false(h, ep, "g1")


async def test_transport_refusing_the_result_gives_provider_error() -> None:
    h, _fx, ep, handle = await flaky(is_success_result)
    result = await run(h, ep, generate("g1", handle))
    assert_safe_error(result, ErrorCode.PROVIDER_ERROR)
    await cancel_is_false(h, ep, "g1")


async def test_transport_refusing_a_delta_ends_the_generation_without_a_gap() -> None:
    seen: list[int] = []

    def third_delta(envelope: dict[str, Any]) -> bool:
        if envelope["type"] != "llm.delta":
            return False
        seen.append(envelope["sequence"])
        return envelope["sequence"] == 2

    h, fx, ep, handle = await flaky(third_delta)
    script = [CREATED, message_added(), *[text_delta(w) for w in "abcdef"]]
    fx.queue([*script, message_done("abcdef"), completed()])
    result = await run(h, ep, generate("g1", handle))
    assert_safe_error(result, ErrorCode.PROVIDER_ERROR)
    assert [d["sequence"] for d in h.deltas(ep, "g1")] == [0, 1]
    await cancel_is_false(h, ep, "g1")


async def test_transport_refusing_everything_never_raises_and_forgets_the_request() -> None:
    h, _fx, ep, handle = await flaky(lambda envelope: envelope["type"] != "llm.select.result")
    h.send(ep, generate("g1", handle))
    await h.settle()
    assert h.results(ep, "g1") == []
    assert not h.shell._generations.of(ep)
    h.transport.fail = lambda envelope: False  # type: ignore[attr-defined]
    await cancel_is_false(h, ep, "g1")


async def test_observer_raising_never_blocks_the_result() -> None:
    h, _fx, ep, handle = await ready()

    def raising(endpoint_id: str, direction: str, envelope: Any) -> None:
        if direction == "out":
            raise RuntimeError("inspector broke")

    h.observer.envelope = raising  # type: ignore[method-assign]
    result = await run(h, ep, generate("g1", handle))
    assert result["result"]["finish"] == "stop"
    await cancel_is_false(h, ep, "g1")


@pytest.mark.parametrize("hook", ["envelope", "notice", "submitted", "dropped"])
async def test_every_observer_hook_raising_never_blocks_an_answer(hook: str) -> None:
    h, fx, ep, handle = await ready()

    def raising(*args: Any) -> None:
        raise RuntimeError("inspector broke")

    setattr(h.observer, hook, raising)
    fx.queue([CREATED, Fail(detail="down", user_hint="Start the server.")])
    for rid in ("g1", "g2"):  # a provider failure with a user hint, then a success
        h.send(ep, with_tools(rid, handle))
        await h.settle()
        check_generation(h, ep, rid)
    h.send(ep, {"type": "llm.generate", "id": "g3", "request": {"handle": handle}})
    h.send(ep, {"type": "nonsense"})
    await h.settle()
    assert h.results(ep, "g3")[0]["error"]["code"] == "invalid-request"


async def test_select_and_describe_results_that_cannot_be_built_still_answer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    h, _fx, ep, handle = await ready()

    def broken(self: Any, connection: Any, handle: str) -> dict[str, Any]:
        raise ValueError("inconsistent model record")

    monkeypatch.setattr(selections_module.Selections, "_model", broken)
    h.send(ep, {"type": "llm.describe", "id": "d1", "handle": handle})
    h.send(ep, {"type": "llm.select", "id": "s2"})
    await h.settle()
    for rid, kind in (("d1", "llm.describe.result"), ("s2", "llm.select.result")):
        [answer] = [e for e in h.results(ep, rid) if e["type"] == kind]
        assert_safe_error(answer, ErrorCode.PROVIDER_ERROR)


async def test_transport_refusing_a_select_result_sends_provider_error() -> None:
    h, _fx, ep, _handle = await flaky(
        lambda envelope: (
            envelope["type"] == "llm.select.result"
            and "model" in envelope
            and envelope["id"] == "s2"
        )
    )
    h.send(ep, {"type": "llm.select", "id": "s2"})
    await h.settle()
    [answer] = h.results(ep, "s2")
    assert_safe_error(answer, ErrorCode.PROVIDER_ERROR)


async def test_a_stream_flush_that_raises_gives_provider_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def broken(self: DeltaStream) -> None:
        raise RuntimeError("flush failed")

    monkeypatch.setattr(DeltaStream, "finish", broken)
    h, _fx, ep, handle = await ready()
    h.send(ep, generate("g1", handle))
    await h.settle()
    results = h.results(ep, "g1")
    assert len(results) == 1
    assert_safe_error(results[0], ErrorCode.PROVIDER_ERROR)
    await cancel_is_false(h, ep, "g1")


# ==========================================================================
# B. Surrogate pairs split across deltas: one rule for every path


async def test_lmsp_split_pair_is_joined() -> None:
    h, fx, ep, handle = await ready()
    fx.queue(
        [
            CREATED,
            message_added(),
            text_delta("Hi \ud83d"),
            text_delta("\ude00!"),
            message_done("Hi \ud83d\ude00!"),
            completed(),
        ]
    )
    result = await run(h, ep, generate("g1", handle))
    assert result["result"]["content"] == [{"type": "text", "text": "Hi \U0001f600!"}]
    assert "".join(d.get("text", "") for d in h.deltas(ep, "g1")) == "Hi \U0001f600!"
    assert_clean(h, ep)


@pytest.mark.parametrize(
    ("deltas", "final", "expected"),
    [
        (["a\ud83d", "b"], "a\ud83db", "a\ufffdb"),  # high half never completed
        (["a", "\ude00b"], "a\ude00b", "a\ufffdb"),  # low half alone
        (["a\ud83d"], "a\ud83d", "a\ufffd"),  # held at the end of the item
    ],
    ids=["high-then-text", "low-alone", "high-at-end"],
)
async def test_lone_surrogates_become_replacement_characters(
    deltas: list[str], final: str, expected: str
) -> None:
    h, fx, ep, handle = await ready()
    fx.queue([CREATED, message_added(), *map(text_delta, deltas), message_done(final), completed()])
    result = await run(h, ep, generate("g1", handle))
    assert result["result"]["content"] == [{"type": "text", "text": expected}]
    assert_clean(h, ep)


async def test_lone_surrogate_held_when_a_response_is_truncated() -> None:
    h, fx, ep, handle = await ready()
    fx.queue([CREATED, message_added(), text_delta("ab\ud83d"), incomplete()])
    result = await run(h, ep, generate("g1", handle))
    assert result["result"] == {
        "content": [{"type": "text", "text": "ab\ufffd"}],
        "finish": "length",
        "usage": {"inputTokens": 12, "outputTokens": 3},
    }
    assert_clean(h, ep)


def chat_chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    return {"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}


def chat_script(chunks: list[dict[str, Any]], **options: Any) -> list[LmspEvent]:
    """What an OpenAI-style path (server, WebLLM, wllama) feeds the shell."""
    state = ChatStreamToLmsp(**options)
    events: list[LmspEvent] = []
    for chunk in chunks:
        events.extend(state.feed(chunk))
    events.extend(state.finish())
    return events


async def test_openai_style_split_pair_is_joined_in_text_and_reasoning() -> None:
    h, fx, ep, handle = await ready()
    fx.queue(
        chat_script(
            [
                chat_chunk({"reasoning_content": "\ud83e"}),
                chat_chunk({"reasoning_content": "\udd14"}),
                chat_chunk({"content": "\ud83d"}),
                chat_chunk({"content": "\ude00"}),
                chat_chunk({}, "stop"),
            ]
        )
    )
    result = await run(h, ep, generate("g1", handle))
    assert result["result"]["content"] == [
        {"type": "thinking", "text": "\U0001f914"},
        {"type": "text", "text": "\U0001f600"},
    ]
    assert_clean(h, ep)


async def test_openai_style_arguments_with_a_split_pair_are_joined() -> None:
    h, fx, ep, handle = await ready()
    call = {"index": 0, "id": "call_1", "function": {"name": "get_weather", "arguments": ""}}
    fx.queue(
        chat_script(
            [
                chat_chunk({"tool_calls": [call]}),
                chat_chunk(
                    {"tool_calls": [{"index": 0, "function": {"arguments": '{"city":"\ud83d'}}]}
                ),
                chat_chunk({"tool_calls": [{"index": 0, "function": {"arguments": '\ude00"}'}}]}),
                chat_chunk({}, "tool_calls"),
            ]
        )
    )
    result = await run(h, ep, with_tools("g1", handle))
    assert result["result"]["content"][0]["arguments"] == {"city": "\U0001f600"}
    assert_clean(h, ep)


async def test_openai_style_arguments_with_a_lone_surrogate_are_provider_errors() -> None:
    h, fx, ep, handle = await ready()
    call = {
        "index": 0,
        "id": "call_1",
        "function": {"name": "get_weather", "arguments": '{"city":"\ud83d"}'},
    }
    fx.queue(chat_script([chat_chunk({"tool_calls": [call]}), chat_chunk({}, "tool_calls")]))
    result = await run(h, ep, with_tools("g1", handle))
    assert_safe_error(result, ErrorCode.PROVIDER_ERROR)
    assert_clean(h, ep)


async def test_call_id_or_unknown_name_with_lone_surrogate_never_reaches_the_napplet() -> None:
    h, fx, ep, handle = await ready()
    fx.queue(
        [CREATED, *call_events("get_weather", {}, call_id="c\ud83d"), completed()],
        [CREATED, *call_events("x\ud83d", {}), completed()],
    )
    for rid in ("g1", "g2"):
        result = await run(h, ep, with_tools(rid, handle))
        assert_safe_error(result, ErrorCode.PROVIDER_ERROR)
    assert_clean(h, ep)
    assert not any(d["event"] == "start" for d in h.out(ep) if d["type"] == "llm.delta")


# ==========================================================================
# B. WebLLM: held-back tool-call text is never the answer


async def test_webllm_empty_tool_call_array_is_a_stop_without_text() -> None:
    h, fx, ep, handle = await ready()
    fx.queue(
        chat_script(
            [
                chat_chunk({"content": "["}),
                chat_chunk({"content": "]"}),
                chat_chunk({"role": "assistant", "tool_calls": []}, "tool_calls"),
            ],
            tool_text_in_content=True,
        )
    )
    result = await run(h, ep, with_tools("g1", handle, toolChoice="auto"))
    assert result["result"]["finish"] == "stop"
    assert result["result"]["content"] == []
    assert h.deltas(ep, "g1") == []


# ==========================================================================
# B. Output items completing out of order follow output_index


def out_of_order_script() -> list[LmspEvent]:
    call_added, *call_rest = call_events("get_weather", {"city": "Paris"}, output_index=1)
    return [
        CREATED,
        message_added(0),
        call_added,
        *call_rest,  # the call completes first
        text_delta("Checking."),
        message_done("Checking."),
        completed(),
    ]


async def test_items_completing_out_of_order_follow_output_index() -> None:
    h, fx, ep, handle = await ready()
    fx.queue(out_of_order_script())
    result = await run(h, ep, with_tools("g1", handle))  # checks blockIndex == content index
    content = result["result"]["content"]
    assert [p["type"] for p in content] == ["text", "toolCall"]
    assert content[0]["text"] == "Checking."


async def test_the_replay_keeps_the_providers_order() -> None:
    h, fx, ep, handle = await ready()
    fx.queue(out_of_order_script())
    result = await run(h, ep, with_tools("g1", handle))
    history = [
        {"role": "user", "content": [{"type": "text", "text": "Weather?"}]},
        {"role": "assistant", "content": result["result"]["content"]},
        {
            "role": "toolResult",
            "toolCallId": "call_1",
            "toolName": "get_weather",
            "content": [{"type": "text", "text": "sunny"}],
        },
    ]
    await run(h, ep, with_tools("g2", handle, messages=history))
    replay = [item.type for item in fx.requests[-1].input]
    assert replay == ["message", "message", "function_call", "function_call_output"]


async def test_an_item_added_below_a_streaming_one_is_a_provider_error() -> None:
    h, fx, ep, handle = await ready()
    fx.queue(
        [
            CREATED,
            message_added(1, "msg_1"),
            text_delta("late", "msg_1"),
            message_added(0, "msg_0"),
            message_done("early", 0, "msg_0"),
            message_done("late", 1, "msg_1"),
            completed(),
        ]
    )
    result = await run(h, ep, generate("g1", handle))
    assert_safe_error(result, ErrorCode.PROVIDER_ERROR)


# ==========================================================================
# C. The size of one generation's output (items and characters) is bounded


def many_messages(count: int) -> list[LmspEvent]:
    events = [CREATED]
    for index in range(count):
        item_id = f"msg_{index}"
        events += [
            message_added(index, item_id),
            text_delta("x", item_id),
            message_done("x", index, item_id),
        ]
    return [*events, completed()]


async def test_output_items_up_to_the_bound_reach_the_napplet() -> None:
    h, fx, ep, handle = await ready()
    fx.queue(many_messages(output_order.MAX_OUTPUT_ITEMS))
    result = await run(h, ep, generate("g1", handle))
    assert len(result["result"]["content"]) == output_order.MAX_OUTPUT_ITEMS


async def test_a_flood_of_output_items_ends_early_with_provider_error() -> None:
    # Reading each item cost time linear in the items before it: 4,000
    # items took 5 s of the page's only thread, 20,000 minutes.
    h, fx, ep, handle = await ready()
    fx.queue(many_messages(20_000))
    result = await run(h, ep, generate("g1", handle))
    assert_safe_error(result, ErrorCode.PROVIDER_ERROR)
    assert len(h.out(ep)) < 4 * output_order.MAX_OUTPUT_ITEMS  # start, delta, end each


MIB = 1024 * 1024


def reasoning_added() -> LmspEvent:
    item = {"id": "rs_0", "type": "reasoning", "summary": []}
    return ev("response.output_item.added", output_index=0, item=item)


@pytest.mark.parametrize(
    "script",
    [
        [message_added(), *[text_delta("a" * MIB)] * 5],
        [message_added(), text_delta("a"), message_done("a" * (5 * MIB))],
        [message_added(), message_done("a" * (5 * MIB))],
        [
            reasoning_added(),
            *[ev("response.reasoning_summary_text.delta", item_id="rs_0", delta="a" * MIB)] * 5,
        ],
        call_events("get_weather", "x", fragments=['{"city":"' + "a" * MIB] + ["a" * MIB] * 4)[:-1],
        [
            message_added(),
            text_delta("a" * (3 * MIB)),
            message_added(1, "msg_1"),
            text_delta("a" * (3 * MIB), "msg_1"),
        ],
    ],
    ids=["text-deltas", "completed-text", "completed-only", "thinking", "arguments", "two-items"],
)
async def test_output_text_past_the_bound_ends_with_provider_error(
    script: list[LmspEvent],
) -> None:
    # Nothing else bounded what one generation keeps: a fast server could
    # stream gigabytes into the page before the deadline.
    h, fx, ep, handle = await ready()
    fx.queue([CREATED, *script, completed()])
    result = await run(h, ep, with_tools("g1", handle))
    assert_safe_error(result, ErrorCode.PROVIDER_ERROR)
    sent = sum(len(json.dumps(e)) for e in h.out(ep))
    assert sent < output_order.MAX_OUTPUT_CHARS + MIB


async def test_shell_keeps_serving_after_hostile_output() -> None:
    h, fx, ep, handle = await ready()
    fx.queue(
        [CREATED, *call_events("get_weather", DEEP_10K), completed()],
        [CREATED, message_added(), text_delta("\udead"), message_done("\udead"), completed()],
    )
    await run(h, ep, with_tools("g1", handle))
    await run(h, ep, generate("g2", handle))
    result = await run(h, ep, generate("g3", handle))
    assert result["result"]["finish"] == "stop"
    await asyncio.sleep(0)
