"""Parts of the LMSP service that need no model: output assembly, event history, token file."""

from __future__ import annotations

import asyncio
import json
import os
import stat
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from napllm.lmsp_service.output import ModelOutputError, OutputItemAssembler
from napllm.lmsp_service.tasks import (
    BoundedStore,
    EventCursorInvalid,
    EventHistoryExpired,
    ResponseRun,
)
from toolcall_cases import MALFORMED, TOOL_NAMES, UNKNOWN_TOOL, WELL_FORMED, block

pytest.importorskip("starlette", reason="the service extra (starlette) is not installed")

from napllm.lmsp_service.auth import (
    BearerAuth,
    TokenFileError,
    load_or_create_token,
)
from napllm.lmsp_service.problems import ProblemError, problem_body

CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Berlin"}}\n</tool_call>'


def assemble(
    chunks: list[str], tools: tuple[str, ...] | None = ("get_weather",), complete: bool = True
) -> tuple[OutputItemAssembler, list[tuple[str, dict[str, Any]]]]:
    events: list[tuple[str, dict[str, Any]]] = []
    assembler = OutputItemAssembler("resp_1", lambda e, d: events.append((e, d)), tools)
    for chunk in chunks:
        assembler.feed(chunk)
    assembler.finish(complete)
    return assembler, events


def split_everywhere(text: str) -> list[list[str]]:
    return [[text[:i], text[i:]] for i in range(len(text) + 1)]


# -- output assembly (6.2, 6.3, 6.5) ---------------------------------------------------


def test_plain_text_is_one_message_item() -> None:
    assembler, events = assemble(["Hello! ", "How can I help?"])
    assert [e for e, _ in events] == [
        "response.output_item.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_item.done",
    ]
    (item,) = assembler.output
    assert item["content"] == [{"type": "output_text", "text": "Hello! How can I help?"}]
    assert events[0][1]["item"]["content"] == []


@pytest.mark.parametrize("chunks", split_everywhere(CALL))
def test_tool_call_split_anywhere_never_leaks_text(chunks: list[str]) -> None:
    assembler, events = assemble(chunks)
    assert "response.output_text.delta" not in [e for e, _ in events]
    (call,) = assembler.output
    assert call["type"] == "function_call" and call["name"] == "get_weather"
    assert json.loads(call["arguments"]) == {"city": "Berlin"}
    assert call["call_id"].startswith("call_") and call["id"].startswith("fc_")


@settings(max_examples=200, deadline=None)
@given(
    before=st.text(alphabet="ab <>/_tool", max_size=12),
    after=st.text(alphabet="ab <>/_tool", max_size=12),
    cuts=st.lists(st.integers(min_value=0, max_value=200), max_size=6),
)
def test_text_around_calls_is_kept_exactly(before: str, after: str, cuts: list[int]) -> None:
    # Text that merely looks like the start of a block must come out unchanged.
    assert "<tool_call>" not in before + after  # the alphabet has no "c"
    text = before + CALL + after
    points = sorted({min(c, len(text)) for c in cuts})
    chunks = [text[a:b] for a, b in zip([0, *points], [*points, len(text)], strict=True)]
    assembler, _ = assemble(chunks)
    messages = "".join(
        p["text"] for item in assembler.output if item["type"] == "message" for p in item["content"]
    )
    expected = "".join(part for part in (before, after) if part.strip())
    assert messages == expected
    assert len(assembler.function_calls()) == 1


def test_text_with_tool_parsing_off_is_verbatim() -> None:
    assembler, _ = assemble([CALL], tools=None)
    assert assembler.message_text() == CALL
    assert assembler.function_calls() == []


def test_unclosed_block_at_the_end_is_parsed_when_complete() -> None:
    assembler, _ = assemble(['<tool_call>{"name": "get_weather", "arguments": {"city": "Rome"}}'])
    assert json.loads(assembler.function_calls()[0]["arguments"]) == {"city": "Rome"}


def test_cut_block_is_dropped_when_incomplete() -> None:
    assembler, events = assemble(['<tool_call>{"name": "get_wea'], complete=False)
    assert assembler.output == [] and events == []


@pytest.mark.parametrize(("body", "name", "arguments"), [c[1:] for c in WELL_FORMED],
                         ids=[c[0] for c in WELL_FORMED])  # fmt: skip
def test_well_formed_tool_calls(body: str, name: str, arguments: str) -> None:
    # the shared table (tests/toolcall_cases.py), as the browser engines read it
    assembler, _ = assemble([block(body)], tools=TOOL_NAMES)
    [call] = assembler.function_calls()
    assert (call["name"], call["arguments"]) == (name, arguments)
    assert assembler.message_text() == ""


@pytest.mark.parametrize(("body", "reason"), [*(c[1:] for c in MALFORMED), UNKNOWN_TOOL],
                         ids=[*(c[0] for c in MALFORMED), "unknown-tool"])  # fmt: skip
def test_malformed_tool_calls_are_errors(body: str, reason: str) -> None:
    with pytest.raises(ModelOutputError, match=reason):
        assemble(["Sure. " + block(body)], tools=TOOL_NAMES, complete=False)


def test_whitespace_only_text_makes_no_item() -> None:
    assembler, events = assemble(["\n", CALL, "\n  "])
    assert [item["type"] for item in assembler.output] == ["function_call"]
    assert all(data["output_index"] == 0 for _, data in events if "output_index" in data)


# -- event history (6.4) -------------------------------------------------------------------


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


async def test_follow_yields_live_events_and_stops_after_final() -> None:
    run = ResponseRun("resp_1", "m")
    run.emit("response.created", {"response_id": "resp_1", "status": "in_progress"})
    seen: list[int] = []

    async def reader() -> None:
        async for event in run.follow(0):
            assert event.id is not None
            seen.append(event.id)

    task = asyncio.create_task(reader())
    await asyncio.sleep(0)
    run.emit("response.output_text.delta", {"response_id": "resp_1", "item_id": "x", "delta": "a"})
    run.finish("completed", "response.completed", {"response_id": "resp_1", "status": "completed"})
    await asyncio.wait_for(task, 1)
    assert seen == [1, 2, 3]
    with pytest.raises(RuntimeError):
        run.emit("response.output_text.delta", {})


async def test_retention_expires_old_events() -> None:
    clock = FakeClock()
    run = ResponseRun("resp_1", "m", retention_s=10, clock=clock)
    run.emit("response.created", {"response_id": "resp_1"})
    clock.now = 5
    run.emit("response.output_text.delta", {"response_id": "resp_1"})
    clock.now = 12  # event 1 is older than 10 s, event 2 is not
    with pytest.raises(EventHistoryExpired):
        run.check_cursor(0)
    run.check_cursor(1)  # events after 1 are all still there
    clock.now = 16
    with pytest.raises(EventHistoryExpired):
        run.check_cursor(1)
    run.check_cursor(2)
    with pytest.raises(EventCursorInvalid):
        run.check_cursor(3)
    with pytest.raises(EventCursorInvalid):
        run.check_cursor(-1)


def test_bounded_store_evicts_oldest() -> None:
    store: BoundedStore[str, int] = BoundedStore(2)
    store.put("a", 1)
    store.put("b", 2)
    store.put("c", 3)
    assert (store.get("a"), store.get("b"), store.get("c"), len(store)) == (None, 2, 3, 2)


# -- token file and bearer check (docs/lmsp.md, section 7) ---------------------------------


def test_token_is_created_private_and_reused(tmp_path: Path) -> None:
    path = tmp_path / "dir" / "lmsp-token"
    token, created = load_or_create_token(path)
    assert created and len(token) >= 40
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert load_or_create_token(path) == (token, False)


def test_token_file_readable_by_others_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "lmsp-token"
    path.write_text("secret\n")
    os.chmod(path, 0o644)
    with pytest.raises(TokenFileError):
        load_or_create_token(path)
    os.chmod(path, 0o600)
    path.write_text("")
    with pytest.raises(TokenFileError):
        load_or_create_token(path)


@pytest.mark.parametrize(
    "header", [None, "", "Bearer", "Bearer wrong", "Basic s3cret", "bearer s3cret2", "s3cret"]
)
def test_bearer_check_refuses(header: str | None) -> None:
    with pytest.raises(ProblemError) as info:
        BearerAuth("s3cret").check(header)
    assert info.value.status == 401
    assert info.value.headers == {"WWW-Authenticate": "Bearer"}


def test_bearer_check_accepts() -> None:
    BearerAuth("s3cret").check("Bearer s3cret")
    BearerAuth("s3cret").check("bearer s3cret")


def test_problem_body_shape() -> None:
    body = problem_body("context_length_exceeded", instance="/lmsp/v1/responses")
    assert body == {
        "type": "about:blank",
        "title": "Bad Request",
        "status": 400,
        "detail": "The input does not fit the model's context window.",
        "code": "context_length_exceeded",
        "instance": "/lmsp/v1/responses",
    }
    with pytest.raises(ValueError):
        ProblemError("made_up")


# -- handlers, one at a time -----------------------------------------------------------


def test_handlers_can_be_called_one_by_one() -> None:
    from types import SimpleNamespace

    from starlette.requests import Request

    from napllm.lmsp_service.app import LmspHandlers

    service = SimpleNamespace(
        config=SimpleNamespace(),
        facts=SimpleNamespace(model_id="tinychat"),
        find_task=lambda task_id: None,
        find_response=lambda response_id: None,
    )
    handlers = LmspHandlers(service)  # type: ignore[arg-type]

    def request(**path_params: str) -> Request:
        return Request({"type": "http", "method": "GET", "headers": [], "path_params": path_params})

    for call, code in [
        (handlers.get_model(request(model_id="other")), "model_not_found"),
        (handlers.get_task(request(task_id="task_1")), "task_not_found"),
        (handlers.get_response(request(response_id="resp_1")), "response_not_found"),
    ]:
        with pytest.raises(ProblemError) as caught:
            asyncio.run(call)
        assert caught.value.code == code


def test_a_client_leaving_while_it_sends_the_body_is_no_service_fault() -> None:
    # starlette raises ClientDisconnect from the body stream; it reached the
    # service's catch-all and was logged as an unhandled error with a
    # traceback, one per such client (a flood filled the log).
    from starlette.requests import ClientDisconnect, Request

    from napllm.lmsp_service.app import _read_body

    messages = [
        {"type": "http.request", "body": b'{"a":', "more_body": True},
        {"type": "http.disconnect"},
    ]

    async def receive() -> dict[str, Any]:
        return messages.pop(0)

    scope = {
        "type": "http",
        "method": "POST",
        "path": "/",
        "headers": [(b"content-type", b"application/json")],
    }
    request = Request(scope, receive)
    with pytest.raises(ProblemError) as caught:
        asyncio.run(_read_body(request, 1024, 5.0))
    assert not isinstance(caught.value, ClientDisconnect)
