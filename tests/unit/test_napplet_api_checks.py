"""The napplet-side Python API refuses what the shell would refuse, before sending,
and reads only what the NAP-LLM records allow.

One source: for each bad request the API raises the exception of the code
the shell answers, with the shell's own message, and sends nothing; the same
envelope sent to the shell directly gets that very error. Replies that break
the records raise `ProtocolError`; replies for other ids are ignored.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable
from typing import Any

import pytest
from harness import PNG
from napplet_link import link, linked_harness

from napllm.connection_records import Capabilities
from napllm.napplet import (
    InvalidRequestError,
    Llm,
    LlmError,
    ProtocolError,
    QuotaExceededError,
    UnknownCodeError,
    UnsupportedError,
)
from napllm.napplet.outgoing import MAX_WIRE_CHARS
from napllm.providers.fixture import Stall

CALL = {"type": "toolCall", "toolCallId": "c1", "name": "f", "arguments": {}}
BAD_REQUESTS: dict[str, tuple[Any, dict[str, Any]]] = {
    "unknown message field": ([{"role": "user", "content": [], "extra": 1}], {}),
    "empty content": ([{"role": "user", "content": []}], {}),
    "bad role": ([{"role": "robot", "text": "hi"}], {}),
    "zero maxTokens": ("hi", {"max_tokens": 0}),
    "string maxTokens": ("hi", {"max_tokens": "5"}),
    "choice without tools": ("hi", {"tool_choice": "auto"}),
    "bad tool name": ("hi", {"tools": [{"name": "no spaces allowed"}]}),
    "non-object schema": ("hi", {"tools": [{"name": "f", "parameters": {"type": "array"}}]}),
    "image that is not base64": (
        [{"role": "user", "content": [{"type": "image", "mimeType": "image/png", "data": "??"}]}],
        {},
    ),
    "orphaned tool result": (
        [
            {"role": "user", "text": "hi"},
            {"role": "toolResult", "toolCallId": "c1", "toolName": "f", "text": "r"},
        ],
        {},
    ),
    "unanswered tool call": (
        [{"role": "user", "text": "hi"}, {"role": "assistant", "content": [CALL]}],
        {},
    ),
    "thinking in a user message": (
        [{"role": "user", "content": [{"type": "thinking", "text": "x"}]}],
        {},
    ),
}


@pytest.mark.parametrize("case", list(BAD_REQUESTS))
async def test_a_request_the_shell_refuses_raises_its_error_before_sending(case: str) -> None:
    h = linked_harness()
    h.connect()
    side = link(h)
    llm = Llm(side)
    handle = (await asyncio.wait_for(llm.select(), 5)).handle
    messages, options = BAD_REQUESTS[case]
    with pytest.raises(InvalidRequestError) as caught:
        await llm.generate(messages, **options)
    assert side.types() == ["llm.select"]  # nothing more was sent
    # the shell, given the same request, answers with the same code and message
    request = {"handle": handle, "messages": _plain_messages(messages)}
    request.update(_wire_options(options))
    h.send(side.endpoint_id, {"type": "llm.generate", "id": "raw", "request": request})
    await h.settle()
    answer = h.results(side.endpoint_id, "raw")[0]["error"]
    assert (answer["code"], answer["message"]) == ("invalid-request", caught.value.message)


def _plain_messages(messages: Any) -> Any:
    from napllm.napplet.outgoing import to_messages

    return to_messages(messages)


def _wire_options(options: dict[str, Any]) -> dict[str, Any]:
    names = {"max_tokens": "maxTokens", "tool_choice": "toolChoice", "tools": "tools"}
    return {names[k]: v for k, v in options.items()}


async def test_what_the_model_cannot_take_is_unsupported_before_sending() -> None:
    h = linked_harness()
    h.connect(caps=Capabilities())
    side = link(h)
    llm = Llm(side)
    await asyncio.wait_for(llm.select(), 5)
    image = [{"role": "user", "content": [{"type": "image", "mimeType": "image/png", "data": PNG}]}]
    for messages, options in [
        ("hi", {"format": "json"}),
        ("hi", {"tools": [{"name": "f"}]}),
        (image, {}),
    ]:
        with pytest.raises(UnsupportedError):
            await llm.generate(messages, **options)
    assert side.types() == ["llm.select"]


async def test_values_json_cannot_carry_and_oversized_requests_are_refused_before_sending() -> None:
    h = linked_harness()
    h.connect()
    side = link(h)
    llm = Llm(side)
    await asyncio.wait_for(llm.select(), 5)
    with pytest.raises(InvalidRequestError):
        await llm.generate("hi", temperature=float("nan"))
    with pytest.raises(InvalidRequestError):
        await llm.generate([{"role": "user", "content": [{"type": "text", "text": object()}]}])
    with pytest.raises(QuotaExceededError):
        await llm.generate("x" * MAX_WIRE_CHARS)
    with pytest.raises(QuotaExceededError):  # counted in UTF-16 code units, as the page does
        await llm.generate("\U0001f600" * (MAX_WIRE_CHARS // 2))
    assert side.types() == ["llm.select"]


def test_the_wire_limit_is_the_page_s() -> None:
    from pathlib import Path

    wire_js = Path(__file__).parents[2] / "web" / "js" / "wire.js"
    assert "export const MAX_WIRE_CHARS = 8 * 1024 * 1024;" in wire_js.read_text("utf-8")
    assert MAX_WIRE_CHARS == 8 * 1024 * 1024


async def test_the_shell_s_invalid_request_for_a_duplicate_id_is_raised() -> None:
    h = linked_harness()
    fx = h.connect()
    side = link(h)
    llm = Llm(side)
    await asyncio.wait_for(llm.select(), 5)
    llm._ids = itertools.repeat(7)  # force the id of an active generation again
    fx.queue([Stall()])
    first = asyncio.create_task(llm.generate("one"))
    for _ in range(20):
        await asyncio.sleep(0)
    with pytest.raises(InvalidRequestError):
        await asyncio.wait_for(llm.generate("two"), 5)
    first.cancel()
    with pytest.raises(asyncio.CancelledError):
        await first
    await h.settle()
    assert fx.submissions == 1


class ScriptedShell:
    """A transport answering each request with `answer(envelope)` (a list of messages)."""

    def __init__(self, answer: Callable[[dict[str, Any]], list[Any]]) -> None:
        self.answer = answer
        self.receiver: Callable[[object], None] = lambda m: None

    def send(self, envelope: dict[str, Any]) -> None:
        loop = asyncio.get_running_loop()
        for message in self.answer(envelope):
            loop.call_soon(self.receiver, message)

    def listen(self, receiver: Callable[[object], None]) -> None:
        self.receiver = receiver


MODEL = {
    "handle": "h1",
    "name": "n",
    "model": "m",
    "route": "r",
    "images": False,
    "json": True,
    "tools": False,
    "toolChoiceModes": [],
}


@pytest.mark.parametrize(
    "reply",
    [
        {"model": {**MODEL, "tools": True}},  # tools without its modes
        {"model": {**MODEL, "extra": 1}},
        {"model": MODEL, "error": {"code": "timeout", "message": "m"}},
        {},
        {"error": {"code": "timeout"}},
        {"error": "timeout"},
    ],
)
async def test_a_reply_that_breaks_the_records_is_a_protocol_error(reply: dict[str, Any]) -> None:
    shell = ScriptedShell(lambda e: [{"type": "llm.select.result", "id": e["id"], **reply}])
    with pytest.raises(ProtocolError):
        await asyncio.wait_for(Llm(shell).select(), 5)


async def test_unknown_codes_fail_and_foreign_or_wrong_type_replies_are_ignored() -> None:
    def answer(e: dict[str, Any]) -> list[Any]:
        rid = e["id"]
        return [
            "not an envelope",
            {"type": "llm.select.result", "id": "someone-else", "model": MODEL},
            {"type": "llm.describe.result", "id": rid, "model": MODEL},  # wrong result type
            {"type": "llm.delta", "requestId": rid},
            {"type": "llm.select.result", "id": rid, "error": {"code": "new", "message": "m"}},
            {"type": "llm.select.result", "id": rid, "model": MODEL},  # after the terminal one
        ]

    llm = Llm(ScriptedShell(answer))
    with pytest.raises(UnknownCodeError) as caught:
        await asyncio.wait_for(llm.select(), 5)
    assert isinstance(caught.value, LlmError) and caught.value.code == "new"
    for _ in range(10):
        await asyncio.sleep(0)
    assert llm.model is None and len(llm._inbox) == 0


async def test_a_generation_result_that_breaks_the_records_is_a_protocol_error() -> None:
    def answer(e: dict[str, Any]) -> list[Any]:
        if e["type"] == "llm.select":
            return [{"type": "llm.select.result", "id": e["id"], "model": MODEL}]
        bad = {"content": [{"type": "text", "text": "x"}], "finish": "toolUse"}
        return [{"type": "llm.generate.result", "id": e["id"], "result": bad}]

    llm = Llm(ScriptedShell(answer))
    with pytest.raises(ProtocolError):
        await asyncio.wait_for(llm.generate("hi"), 5)


async def test_without_the_llm_domain_every_call_is_unsupported_at_once() -> None:
    class Absent(ScriptedShell):
        def available(self) -> bool:
            return False

    sent: list[Any] = []
    llm = Llm(Absent(lambda e: sent.append(e) or []))
    assert llm.available is False
    with pytest.raises(UnsupportedError):
        await llm.select()
    with pytest.raises(UnsupportedError):
        await llm.generate("hi", model="h1")
    assert sent == []
