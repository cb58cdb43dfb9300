"""The LMSP client provider against in-process fake services (httpx.MockTransport)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest

from fixtures import Body
from napllm.errors import SAFE_MESSAGES, ErrorCode, ProviderFailure
from napllm.kinds import MAX_LISTED_MODELS
from napllm.lmsp import (
    BUSY_HINT,
    CONTEXT_TOO_LONG,
    TOKEN_REJECTED_HINT,
    LmspEvent,
    LmspRequest,
    ModelEntry,
)
from napllm.providers.http_httpx import HttpxPort
from napllm.providers.lmsp_client import (
    CONNECTION_LOST_HINT,
    UNREACHABLE_HINT,
    LmspProvider,
    api_root,
    capabilities_from_entry,
    discover_models,
)

BASE = "http://127.0.0.1:9"
SECRET = "sk-live-SECRET-4242"
RID = "resp_1"
MSG = {"id": "msg_1", "type": "message", "role": "assistant", "content": []}
FULL_MSG = {**MSG, "content": [{"type": "output_text", "text": "Hello there"}]}


def request(stream: bool = True) -> LmspRequest:
    return LmspRequest.model_validate(
        {
            "model": "tiny",
            "input": [
                {
                    "type": "message",
                    "role": "user",
                    "content": [{"type": "input_text", "text": "Hi"}],
                }
            ],
            "stream": stream,
        },
        strict=False,
    )


def ev(event_id: int | None, event: str, **data: Any) -> LmspEvent:
    return LmspEvent(id=event_id, event=event, data={"response_id": RID, **data})


STREAM = [
    ev(1, "response.created", status="in_progress"),
    ev(2, "response.output_item.added", output_index=0, item=MSG),
    ev(3, "response.output_text.delta", item_id="msg_1", delta="Hello"),
    ev(4, "response.output_text.delta", item_id="msg_1", delta=" there"),
    ev(5, "response.output_item.done", output_index=0, item=FULL_MSG),
    ev(6, "response.completed", status="completed", usage={"input_tokens": 3, "output_tokens": 2}),
]

FINAL_RESPONSE = {
    "id": RID,
    "object": "response",
    "created_at": 1,
    "status": "completed",
    "model": "tiny",
    "output": [FULL_MSG],
    "usage": {"input_tokens": 3, "output_tokens": 2, "total_tokens": 5},
    "error": None,
    "incomplete_details": None,
}


def sse(*events: LmspEvent) -> bytes:
    return "".join(e.to_sse() for e in events).encode()


def stream_response(body: Body) -> httpx.Response:
    return httpx.Response(200, headers={"content-type": "text/event-stream"}, stream=body)


def problem(status: int, code: str) -> httpx.Response:
    return httpx.Response(
        status,
        headers={"content-type": "application/problem+json"},
        json={
            "type": "about:blank",
            "title": f"Bad {SECRET}",
            "status": status,
            "detail": f"token {SECRET} and prompt 'my diary' rejected",
            "code": code,
        },
    )


Handler = Callable[[httpx.Request], Awaitable[httpx.Response]]


@dataclass
class Fake:
    """A scripted LMSP service: `handler` answers, `seen` records every request."""

    handler: Handler
    seen: list[httpx.Request] = field(default_factory=list)

    async def __call__(self, req: httpx.Request) -> httpx.Response:
        self.seen.append(req)
        return await self.handler(req)

    def provider(self, **options: Any) -> LmspProvider:
        sleeps: list[float] = []

        async def no_sleep(seconds: float) -> None:
            sleeps.append(seconds)

        options.setdefault("sleep", no_sleep)
        client = httpx.AsyncClient(transport=httpx.MockTransport(self))
        provider = LmspProvider(HttpxPort(client), BASE, SECRET, **options)
        provider.sleeps = sleeps  # type: ignore[attr-defined]
        return provider

    def paths(self) -> list[str]:
        return [f"{r.method} {r.url.raw_path.decode()}" for r in self.seen]


async def collect(provider: LmspProvider, req: LmspRequest | None = None) -> list[LmspEvent]:
    return [e async for e in provider.respond(req or request())]


def without_ids(events: list[LmspEvent]) -> list[tuple[str, dict[str, Any]]]:
    return [(e.event, e.data) for e in events]


async def failure(provider: LmspProvider, req: LmspRequest | None = None) -> ProviderFailure:
    with pytest.raises(ProviderFailure) as info:
        await collect(provider, req)
    return info.value


def assert_no_leak(exc: ProviderFailure) -> None:
    for text in (str(exc), exc.to_nap_error().message, exc.user_hint or "", exc.detail or ""):
        assert SECRET not in text
        assert "diary" not in text


# --------------------------------------------------------------------------
# synchronous and direct streams


async def test_sync_response_becomes_events_and_headers_are_sent() -> None:
    async def handler(req: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json=FINAL_RESPONSE)

    fake = Fake(handler)
    provider = fake.provider()
    events = await collect(provider, request(stream=False))
    await collect(provider, request(stream=False))
    assert [e.event for e in events] == [
        "response.created",
        "response.output_item.added",
        "response.output_item.done",
        "response.completed",
    ]
    assert events[2].data["item"] == FULL_MSG
    first, second = fake.seen
    assert first.method == "POST" and first.url.path == "/lmsp/v1/responses"
    assert first.headers["authorization"] == f"Bearer {SECRET}"
    assert first.headers["lmsp-version"] == "1.0"
    assert first.headers["content-type"] == "application/json"
    assert json.loads(first.content) == request(stream=False).to_json()
    keys = {first.headers["idempotency-key"], second.headers["idempotency-key"]}
    assert len(keys) == 2 and all(len(k) >= 32 for k in keys)


async def test_stream_yields_known_events_in_order_and_skips_unknown_ones() -> None:
    unknown = [
        ev(3, "response.in_progress"),
        ev(4, "response.content_part.added", item_id="msg_1"),
    ]
    renumbered = [STREAM[0], STREAM[1], *unknown]
    renumbered += [
        LmspEvent(id=n + 5, event=e.event, data=e.data) for n, e in enumerate(STREAM[2:])
    ]
    chunked = sse(*renumbered)

    async def handler(req: httpx.Request) -> httpx.Response:
        # split the body at awkward places, with keep-alive comments
        pieces = [b": ping\r\n\r\n", *[chunked[i : i + 7] for i in range(0, len(chunked), 7)]]
        return stream_response(Body(*pieces))

    fake = Fake(handler)
    events = await collect(fake.provider())
    assert without_ids(events) == without_ids(STREAM)
    assert [e.id for e in events] == [1, 2, 5, 6, 7, 8]
    assert fake.seen[0].headers["accept"] == "text/event-stream"


async def test_events_after_the_terminal_event_are_not_read() -> None:
    async def handler(req: httpx.Request) -> httpx.Response:
        return stream_response(Body(sse(*STREAM), b"id: 7\nevent: response.created\ndata: {}\n\n"))

    events = await collect(Fake(handler).provider())
    assert events[-1].event == "response.completed"
    assert len(events) == 6


@pytest.mark.parametrize(
    "body",
    [
        b"id: 2\nevent: response.created\ndata: {}\n\n",  # does not start at 1
        b"id: 0\nevent: response.created\ndata: {}\n\n",
        b"id: 1\nevent: response.created\ndata: {}\n\nid: 1\nevent: response.created\ndata: {}\n\n",
        b"id: 1\nevent: response.created\ndata: {}\n\nevent: response.created\ndata: {}\n\n",
        b"event: response.created\ndata: {}\n\n",  # no id at all
        b"id: 1\nevent: response.created\ndata: {}\n\nid: 0x2\nevent: error\ndata: {}\n\n",
        b"id: 1\nevent: response.created\ndata: [1]\n\n",
        b"id: 1\nevent: response.created\ndata: {oops\n\n",
        b"id: 1\nevent: response.created\ndata: {}\n\n"
        b"id: 3\nevent: response.created\ndata: {}\n\nid: 2\nevent: response.created\ndata: {}\n\n",
        b'id: 1\nevent: response.created\ndata: {"d":' + b"[" * 10_000 + b"]" * 10_000 + b"}\n\n",
        b'id: 1\nevent: response.created\ndata: {"x":NaN}\n\n',
    ],
)
async def test_protocol_violations_are_provider_errors(body: bytes) -> None:
    async def handler(req: httpx.Request) -> httpx.Response:
        return stream_response(Body(body, sse(*STREAM)))

    exc = await failure(Fake(handler).provider())
    assert exc.code is ErrorCode.PROVIDER_ERROR
    assert exc.to_nap_error().message == SAFE_MESSAGES[ErrorCode.PROVIDER_ERROR]


async def test_gaps_in_ids_are_allowed_when_strictly_increasing() -> None:
    spaced = [
        LmspEvent(id=1 if n == 0 else n * 10, event=e.event, data=e.data)
        for n, e in enumerate(STREAM)
    ]

    async def handler(req: httpx.Request) -> httpx.Response:
        return stream_response(Body(sse(*spaced)))

    assert len(await collect(Fake(handler).provider())) == 6


async def test_direct_stream_dropped_before_the_end_is_a_provider_error() -> None:
    async def handler(req: httpx.Request) -> httpx.Response:
        return stream_response(Body(sse(*STREAM[:3]), drop=True))

    exc = await failure(Fake(handler).provider())
    assert exc.code is ErrorCode.PROVIDER_ERROR
    assert exc.user_hint == CONNECTION_LOST_HINT


async def test_direct_stream_closed_cleanly_without_final_event() -> None:
    async def handler(req: httpx.Request) -> httpx.Response:
        return stream_response(
            Body(sse(*STREAM[:3]), b"id: 4\nevent: response.completed\ndata: {}")
        )

    exc = await failure(Fake(handler).provider())
    assert exc.user_hint == CONNECTION_LOST_HINT


async def test_stream_request_answered_with_json_is_accepted() -> None:
    async def handler(req: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json=FINAL_RESPONSE)

    events = await collect(Fake(handler).provider())
    assert events[-1].event == "response.completed"


async def test_malformed_sync_response_is_a_provider_error() -> None:
    async def handler(req: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={"id": 5, "status": "completed", "secret": SECRET})

    exc = await failure(Fake(handler).provider(), request(stream=False))
    assert_no_leak(exc)


# --------------------------------------------------------------------------
# problems and transport failures


@pytest.mark.parametrize(
    ("status", "code", "nap_code", "message", "hint"),
    [
        (
            400,
            "unsupported_capability",
            ErrorCode.UNSUPPORTED,
            SAFE_MESSAGES[ErrorCode.UNSUPPORTED],
            None,
        ),
        (400, "context_length_exceeded", ErrorCode.UNSUPPORTED, CONTEXT_TOO_LONG, None),
        (
            401,
            "unauthorized",
            ErrorCode.PROVIDER_ERROR,
            SAFE_MESSAGES[ErrorCode.PROVIDER_ERROR],
            TOKEN_REJECTED_HINT,
        ),
        (
            403,
            "forbidden",
            ErrorCode.PROVIDER_ERROR,
            SAFE_MESSAGES[ErrorCode.PROVIDER_ERROR],
            TOKEN_REJECTED_HINT,
        ),
        (
            429,
            "rate_limited",
            ErrorCode.PROVIDER_ERROR,
            SAFE_MESSAGES[ErrorCode.PROVIDER_ERROR],
            BUSY_HINT,
        ),
        (
            400,
            "invalid_request",
            ErrorCode.PROVIDER_ERROR,
            SAFE_MESSAGES[ErrorCode.PROVIDER_ERROR],
            None,
        ),
        (
            500,
            "generation_failed",
            ErrorCode.PROVIDER_ERROR,
            SAFE_MESSAGES[ErrorCode.PROVIDER_ERROR],
            None,
        ),
        (
            422,
            f"x {SECRET}",
            ErrorCode.PROVIDER_ERROR,
            SAFE_MESSAGES[ErrorCode.PROVIDER_ERROR],
            None,
        ),
    ],
)
@pytest.mark.parametrize("stream", [True, False])
async def test_problems_map_to_safe_failures(
    status: int, code: str, nap_code: ErrorCode, message: str, hint: str | None, stream: bool
) -> None:
    async def handler(req: httpx.Request) -> httpx.Response:
        return problem(status, code)

    exc = await failure(Fake(handler).provider(), request(stream=stream))
    assert exc.code is nap_code
    assert exc.to_nap_error().message == message
    assert exc.user_hint == hint
    assert_no_leak(exc)


@pytest.mark.parametrize(
    "response",
    [
        httpx.Response(500, text=f"<html>Traceback: {SECRET}</html>"),
        httpx.Response(502, json={"error": {"message": SECRET}}),
        httpx.Response(404, json=["not", "a", "problem"]),
    ],
)
async def test_non_problem_error_bodies(response: httpx.Response) -> None:
    async def handler(req: httpx.Request) -> httpx.Response:
        return response

    exc = await failure(Fake(handler).provider())
    assert exc.code is ErrorCode.PROVIDER_ERROR
    assert_no_leak(exc)


async def test_unreachable_service_has_a_hint() -> None:
    async def handler(req: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError(f"connection refused to {SECRET}")

    exc = await failure(Fake(handler).provider())
    assert exc.code is ErrorCode.PROVIDER_ERROR
    assert exc.user_hint == UNREACHABLE_HINT
    assert_no_leak(exc)


@pytest.mark.parametrize("error_id", [2, None])
async def test_error_event_in_a_stream_is_yielded_as_terminal(error_id: int | None) -> None:
    # docs/lmsp.md 2.3: the `error` event has no id (it then repeats the last one)
    error = LmspEvent(id=error_id, event="error", data={"error": {"code": "generation_failed"}})

    async def handler(req: httpx.Request) -> httpx.Response:
        return stream_response(Body(sse(STREAM[0], error)))

    events = await collect(Fake(handler).provider())
    assert events[-1].event == "error"
    assert events[-1].terminal


async def test_only_the_error_event_may_lack_an_id() -> None:
    body = sse(STREAM[0]) + b"event: response.output_item.added\ndata: {}\n\n"

    async def handler(req: httpx.Request) -> httpx.Response:
        return stream_response(Body(body))

    assert (await failure(Fake(handler).provider())).code is ErrorCode.PROVIDER_ERROR


# --------------------------------------------------------------------------
# tasks: resume, 410, cancel


@dataclass
class TaskService:
    """A fake task endpoint whose `events` answers are scripted per connection."""

    connections: list[Callable[[int], httpx.Response]]
    task_states: list[dict[str, Any]] = field(default_factory=list)
    created_status: int = 202

    async def __call__(self, req: httpx.Request) -> httpx.Response:
        path = req.url.path
        if req.method == "POST" and path == "/lmsp/v1/tasks":
            body = {"id": "task_1", "object": "task", "status": "queued", "response": None}
            return httpx.Response(self.created_status, json=body)
        if req.method == "GET" and path == "/lmsp/v1/tasks/task_1/events":
            after = int(req.url.params.get("after", "0"))
            return self.connections.pop(0)(after)
        if req.method == "GET" and path == "/lmsp/v1/tasks/task_1":
            return httpx.Response(200, json=self.task_states.pop(0))
        if req.method == "POST" and path == "/lmsp/v1/tasks/task_1/cancel":
            return httpx.Response(
                200, json={"id": "task_1", "object": "task", "status": "cancelled"}
            )
        return problem(404, "not_found")


def from_after(
    after: int, *, upto: int | None = None, drop: bool = False, hang: bool = False
) -> httpx.Response:
    events = [
        e for e in STREAM if e.id is not None and e.id > after and (upto is None or e.id <= upto)
    ]
    return stream_response(Body(sse(*events), drop=drop, hang=hang))


async def test_task_stream_without_drops() -> None:
    service = TaskService([lambda after: from_after(after)])
    fake = Fake(service)
    events = await collect(fake.provider(resumable=True))
    assert without_ids(events) == without_ids(STREAM)
    post = fake.seen[0]
    assert json.loads(post.content)["stream"] is True
    assert "idempotency-key" in post.headers
    assert "last-event-id" not in fake.seen[1].headers


async def test_task_resumes_after_a_drop_with_last_event_id_and_after() -> None:
    service = TaskService(
        [
            lambda after: from_after(after, upto=3, drop=True),
            lambda after: from_after(after, upto=4, drop=True),
            lambda after: from_after(after),
        ]
    )
    fake = Fake(service)
    provider = fake.provider(resumable=True)
    events = await collect(provider)
    assert without_ids(events) == without_ids(STREAM)  # nothing lost, nothing repeated
    assert [e.id for e in events] == [1, 2, 3, 4, 5, 6]
    second, third = fake.seen[2], fake.seen[3]
    assert second.headers["last-event-id"] == "3" and second.url.params["after"] == "3"
    assert third.headers["last-event-id"] == "4" and third.url.params["after"] == "4"
    assert all(r.headers["authorization"] == f"Bearer {SECRET}" for r in fake.seen)
    assert provider.sleeps == [0.25, 0.25]  # type: ignore[attr-defined]


@pytest.mark.parametrize("replay_from", [0, 2, 3], ids=["all", "some", "last-seen"])
async def test_resumed_stream_replaying_seen_ids_drops_them_silently(replay_from: int) -> None:
    service = TaskService(
        [
            lambda after: from_after(after, upto=3, drop=True),
            lambda after: from_after(replay_from),  # ignores (part of) the resume point
        ]
    )
    events = await collect(Fake(service).provider(resumable=True))
    assert [e.id for e in events] == [1, 2, 3, 4, 5, 6]
    text = "".join(e.data["delta"] for e in events if e.event == "response.output_text.delta")
    assert text == "Hello there"  # not "HelloHello there"


async def test_resumed_stream_going_backwards_after_new_progress_is_a_violation() -> None:
    def replay_after_progress(after: int) -> httpx.Response:
        events = [STREAM[3], STREAM[2]]  # 4 (new), then 3 again
        return stream_response(Body(sse(*events), drop=True))

    service = TaskService(
        [lambda after: from_after(after, upto=3, drop=True), replay_after_progress]
    )
    exc = await failure(Fake(service).provider(resumable=True))
    assert exc.code is ErrorCode.PROVIDER_ERROR


async def test_unknown_events_are_skipped_before_any_id_rule() -> None:
    heartbeat = b"event: heartbeat\ndata: {}\n\n"
    body = sse(*STREAM[:2]) + heartbeat + b": keep-alive\n\n" + heartbeat + sse(*STREAM[2:])

    async def handler(req: httpx.Request) -> httpx.Response:
        return stream_response(Body(heartbeat, body))

    events = await collect(Fake(handler).provider())
    assert without_ids(events) == without_ids(STREAM)


async def test_reconnects_are_bounded_with_growing_backoff() -> None:
    service = TaskService([lambda after: from_after(after, upto=after, drop=True)] * 10)
    fake = Fake(service)
    provider = fake.provider(resumable=True, max_reconnects=3)
    exc = await failure(provider)
    assert exc.user_hint == CONNECTION_LOST_HINT
    assert provider.sleeps == [0.25, 0.5, 1.0]  # type: ignore[attr-defined]
    await provider.join_background()
    assert len(fake.seen) == 1 + 4 + 1  # create, 4 event connections, background cancel
    assert fake.paths()[-1] == "POST /lmsp/v1/tasks/task_1/cancel"


async def test_410_turns_the_final_response_into_the_missing_events() -> None:
    service = TaskService(
        [
            lambda after: from_after(after, upto=3, drop=True),  # created, added, "Hello"
            lambda after: problem(410, "event_history_expired"),
        ],
        task_states=[
            {"id": "task_1", "object": "task", "status": "completed", "response": FINAL_RESPONSE}
        ],
    )
    fake = Fake(service)
    events = await collect(fake.provider(resumable=True))
    assert [e.event for e in events] == [
        "response.created",
        "response.output_item.added",
        "response.output_text.delta",
        "response.output_item.done",  # not added again, no second "Hello"
        "response.completed",
    ]
    assert events[3].data["item"] == FULL_MSG
    assert events[4].data["usage"]["output_tokens"] == 2
    assert fake.paths()[-1] == "GET /lmsp/v1/tasks/task_1"


async def test_410_right_away_yields_the_whole_response() -> None:
    response = {
        **FINAL_RESPONSE,
        "status": "incomplete",
        "incomplete_details": {"reason": "max_output_tokens"},
    }
    service = TaskService(
        [lambda after: problem(410, "event_history_expired")],
        task_states=[
            {"id": "task_1", "object": "task", "status": "in_progress", "response": None},
            {"id": "task_1", "object": "task", "status": "incomplete", "response": response},
        ],
    )
    provider = Fake(service).provider(resumable=True)
    events = await collect(provider)
    assert [e.event for e in events] == [
        "response.created",
        "response.output_item.added",
        "response.output_item.done",
        "response.incomplete",
    ]
    assert provider.sleeps  # type: ignore[attr-defined]  # polled while in progress


async def test_history_expired_error_event_while_following() -> None:
    expired = b'event: error\ndata: {"error": {"code": "event_history_expired", "status": 410}}\n\n'
    service = TaskService(
        [lambda after: stream_response(Body(sse(*STREAM[:2]), expired))],
        task_states=[
            {"id": "task_1", "object": "task", "status": "completed", "response": FINAL_RESPONSE}
        ],
    )
    events = await collect(Fake(service).provider(resumable=True))
    assert [e.event for e in events][-2:] == ["response.output_item.done", "response.completed"]
    assert [e.event for e in events].count("response.output_item.added") == 1


async def test_410_with_another_code_is_a_failure() -> None:
    service = TaskService([lambda after: problem(410, "task_gone")])
    exc = await failure(Fake(service).provider(resumable=True))
    assert exc.code is ErrorCode.PROVIDER_ERROR
    assert_no_leak(exc)


async def test_task_creation_problem() -> None:
    service = TaskService([])
    service.created_status = 400

    async def handler(req: httpx.Request) -> httpx.Response:
        if req.url.path == "/lmsp/v1/tasks":
            return problem(400, "context_length_exceeded")
        return await service(req)

    exc = await failure(Fake(handler).provider(resumable=True))
    assert exc.to_nap_error().message == CONTEXT_TOO_LONG
    assert_no_leak(exc)


async def test_cancelling_the_consumer_cancels_the_task_without_blocking() -> None:
    bodies: list[Body] = []

    def hanging(after: int) -> httpx.Response:
        body = Body(sse(*STREAM[:3]), hang=True)
        bodies.append(body)
        return stream_response(body)

    service = TaskService([hanging])
    fake = Fake(service)
    provider = fake.provider(resumable=True)
    got: list[LmspEvent] = []

    async def consume() -> None:
        async for event in provider.respond(request()):
            got.append(event)

    job = asyncio.create_task(consume())
    while len(got) < 3:
        await asyncio.sleep(0)
    job.cancel()
    with pytest.raises(asyncio.CancelledError):
        await job
    assert bodies[0].closed
    await provider.join_background()
    assert fake.paths()[-1] == "POST /lmsp/v1/tasks/task_1/cancel"
    cancel = fake.seen[-1]
    assert cancel.headers["authorization"] == f"Bearer {SECRET}"
    assert cancel.content == b""  # docs/lmsp.md 5.4: no body


async def test_aclose_of_the_iterator_cancels_the_task() -> None:
    service = TaskService([lambda after: from_after(after, upto=3, hang=True)])
    fake = Fake(service)
    provider = fake.provider(resumable=True)
    iterator = provider.respond(request())
    first = await anext(iterator)
    assert first.event == "response.created"
    await iterator.aclose()  # type: ignore[attr-defined]
    await provider.join_background()
    assert fake.paths()[-1] == "POST /lmsp/v1/tasks/task_1/cancel"


async def test_finished_task_is_not_cancelled() -> None:
    service = TaskService([lambda after: from_after(after)])
    fake = Fake(service)
    provider = fake.provider(resumable=True)
    await collect(provider)
    await provider.join_background()
    assert not any(p.endswith("/cancel") for p in fake.paths())


async def test_cancelling_a_direct_stream_closes_it() -> None:
    body = Body(sse(*STREAM[:2]), hang=True)

    async def handler(req: httpx.Request) -> httpx.Response:
        return stream_response(body)

    provider = Fake(handler).provider()
    iterator = provider.respond(request())
    await anext(iterator)
    await iterator.aclose()  # type: ignore[attr-defined]
    assert body.closed


# --------------------------------------------------------------------------
# discovery


async def test_discover_models_and_capabilities() -> None:
    listing = {
        "object": "list",
        "data": [
            {
                "id": "tiny",
                "object": "model",
                "context_length": 512,
                "capabilities": {
                    "tools": True,
                    "structured_output": True,
                    "conversations": True,
                    "tool_choice": ["required", "tool"],
                },
            },
            {"id": "plain", "object": "model"},
            {"id": 7},  # malformed entries are skipped
            {"id": "gpt\u202e4o"},  # so are ids that are not visible text
            {"id": "x" * 201},
        ]
        + [{"id": f"m{i}"} for i in range(500)],
    }

    async def handler(req: httpx.Request) -> httpx.Response:
        assert req.headers["authorization"] == f"Bearer {SECRET}"
        assert req.url.path == "/lmsp/v1/models"
        return httpx.Response(200, json=listing)

    client = httpx.AsyncClient(transport=httpx.MockTransport(Fake(handler)))
    entries = await discover_models(HttpxPort(client), BASE + "/", SECRET)
    assert [e.id for e in entries][:3] == ["tiny", "plain", "m0"]
    assert len(entries) == MAX_LISTED_MODELS
    tiny = capabilities_from_entry(entries[0])
    assert tiny.tools and tiny.json_output and not tiny.images
    assert tiny.tool_choice_modes == ("auto", "none", "required", "tool")
    plain = capabilities_from_entry(entries[1])
    assert not plain.tools and plain.tool_choice_modes == () and not plain.json_output
    only_tools = ModelEntry.model_validate(
        {"id": "t", "capabilities": {"tools": True, "images": True}}
    )
    caps = capabilities_from_entry(only_tools)
    assert caps.tool_choice_modes == ("auto", "none") and caps.images


@pytest.mark.parametrize(
    "response",
    [
        problem(401, "unauthorized"),
        httpx.Response(200, json={"data": "x"}),
        httpx.Response(200, text="nope"),
    ],
)
async def test_discover_models_failures(response: httpx.Response) -> None:
    async def handler(req: httpx.Request) -> httpx.Response:
        return response

    client = httpx.AsyncClient(transport=httpx.MockTransport(Fake(handler)))
    with pytest.raises(ProviderFailure) as info:
        await discover_models(HttpxPort(client), BASE, SECRET)
    assert_no_leak(info.value)


def test_api_root() -> None:
    assert api_root("http://h:1") == "http://h:1/lmsp/v1"
    assert api_root("http://h:1/") == "http://h:1/lmsp/v1"
    assert api_root("http://h:1/lmsp/v1/") == "http://h:1/lmsp/v1"


async def test_a_resumed_replaying_stream_reaches_the_napplet_once_and_contiguous() -> None:
    from harness import Harness, generate

    import envelope_rules

    service = TaskService(
        [lambda after: from_after(after, upto=3, drop=True), lambda after: from_after(0)]
    )
    provider = Fake(service).provider(resumable=True)
    h = Harness()
    h.connect()
    h.shell._providers = lambda connection: provider
    ep = h.endpoint()
    handle = await h.select(ep)
    h.send(ep, generate("g1", handle))
    await h.settle()
    result = envelope_rules.check_generation(h.out(ep), "g1")  # contiguous sequence
    assert result["result"]["content"] == [{"type": "text", "text": "Hello there"}]
    deltas = [e["text"] for e in h.deltas(ep, "g1") if e["event"] == "delta"]
    assert "".join(deltas) == "Hello there"
