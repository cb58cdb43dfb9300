"""The LMSP client provider against the real LMSP service running TinyChat (6.1-6.5)."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any

import httpx
import pytest

from fixtures import WEATHER_FUNCTION, done_items, lmsp_user, text_of
from napllm.errors import SAFE_MESSAGES, ErrorCode, ProviderFailure
from napllm.lmsp import CONTEXT_TOO_LONG, TOKEN_REJECTED_HINT, LmspEvent, LmspRequest
from napllm.providers.base import HttpCall
from napllm.providers.http_httpx import HttpxPort, HttpxResponse
from napllm.providers.lmsp_client import (
    LmspProvider,
    capabilities_from_entry,
    discover_models,
)

if TYPE_CHECKING:
    from tests.service.conftest import LmspServiceHandle

pytestmark = pytest.mark.service

HELLO_ANSWER = "Hello! How can I help you today?"
PERSON_SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
    "required": ["name", "age"],
    "additionalProperties": False,
}
LIMIT_S = 60


def make_request(service: LmspServiceHandle, text: str = "Hello!", **fields: Any) -> LmspRequest:
    body = {"model": service.model_id, "input": [lmsp_user(text)], "temperature": 0, **fields}
    return LmspRequest.model_validate(body, strict=False)


class RecordingPort(HttpxPort):
    """The httpx port, recording requests and optionally cutting one event stream.

    `cut_after_events`: the first `GET .../events` body is cut (as a network
    drop: `ConnectionError`) right after that many complete events.
    """

    def __init__(self, client: httpx.AsyncClient, cut_after_events: int | None = None) -> None:
        super().__init__(client)
        self.seen: list[tuple[str, str, dict[str, str]]] = []
        self._cut = cut_after_events

    async def send(self, call: HttpCall) -> HttpxResponse:
        self.seen.append((call.method, call.url, dict(call.headers)))
        response = await super().send(call)
        if self._cut is not None and call.method == "GET" and "/events" in call.url:
            count, self._cut = self._cut, None
            return CutResponse(response, count)  # type: ignore[return-value]
        return response


class CutResponse:
    """A response whose body stops after `count` events with a connection error."""

    def __init__(self, inner: HttpxResponse, count: int) -> None:
        self._inner = inner
        self._count = count
        self.status = inner.status
        self.headers = inner.headers

    async def read(self) -> bytes:
        return await self._inner.read()

    async def aclose(self) -> None:
        await self._inner.aclose()

    async def iter_bytes(self) -> AsyncIterator[bytes]:
        buffered = b""
        async for chunk in self._inner.iter_bytes():
            buffered = (buffered + chunk).replace(b"\r\n", b"\n")
            kept: list[bytes] = []
            for block in buffered.split(b"\n\n")[:-1]:
                kept.append(block)
                if sum(b"\nevent:" in b"\n" + part for part in kept) == self._count:
                    yield b"\n\n".join(kept) + b"\n\n"
                    raise ConnectionError("the connection was reset")
        yield buffered  # fewer events than the cut: the whole body


async def run(provider: LmspProvider, request: LmspRequest) -> list[LmspEvent]:
    async def collect() -> list[LmspEvent]:
        return [e async for e in provider.respond(request)]

    return await asyncio.wait_for(collect(), LIMIT_S)


def deltas(events: list[LmspEvent]) -> str:
    return "".join(e.data["delta"] for e in events if e.event == "response.output_text.delta")


Factory = Callable[..., Awaitable[tuple[LmspProvider, RecordingPort]]]


@pytest.fixture
async def connect(lmsp_service: LmspServiceHandle) -> AsyncIterator[Factory]:
    clients: list[httpx.AsyncClient] = []

    async def factory(
        *, credential: str | None = None, cut_after_events: int | None = None, **options: Any
    ) -> tuple[LmspProvider, RecordingPort]:
        client = httpx.AsyncClient()
        clients.append(client)
        port = RecordingPort(client, cut_after_events)
        token = lmsp_service.token if credential is None else credential
        return LmspProvider(port, lmsp_service.base_url, token, **options), port

    yield factory
    for client in clients:
        await client.aclose()


async def test_sync_response(lmsp_service: LmspServiceHandle, connect: Factory) -> None:
    provider, port = await connect()
    events = await run(provider, make_request(lmsp_service))
    assert text_of(events) == HELLO_ANSWER
    assert events[-1].event == "response.completed"
    assert events[-1].data["usage"]["output_tokens"] > 0
    method, url, headers = port.seen[0]
    assert (method, url) == ("POST", lmsp_service.base_url + "/lmsp/v1/responses")
    assert headers["LMSP-Version"] == "1.0"
    uuid.UUID(headers["Idempotency-Key"])


async def test_stream(lmsp_service: LmspServiceHandle, connect: Factory) -> None:
    provider, _ = await connect()
    events = await run(provider, make_request(lmsp_service, stream=True))
    ids = [e.id for e in events]
    assert ids[0] == 1 and ids == sorted(set(ids))  # type: ignore[type-var]
    assert deltas(events) == text_of(events) == HELLO_ANSWER
    assert events[-1].event == "response.completed"


async def test_tool_round_trip(lmsp_service: LmspServiceHandle, connect: Factory) -> None:
    provider, _ = await connect()
    question = lmsp_user("What is the weather in Paris?")
    first = await run(
        provider,
        LmspRequest.model_validate(
            {
                "model": lmsp_service.model_id,
                "input": [question],
                "tools": [WEATHER_FUNCTION],
                "temperature": 0,
                "stream": True,
            },
            strict=False,
        ),
    )
    (call,) = [i for i in done_items(first) if i["type"] == "function_call"]
    assert call["name"] == "get_weather"
    assert json.loads(call["arguments"]) == {"city": "Paris"}
    result = json.dumps({"city": "Paris", "temperature": 21, "condition": "sunny"})
    second = await run(
        provider,
        LmspRequest.model_validate(
            {
                "model": lmsp_service.model_id,
                "input": [
                    question,
                    {
                        "type": "function_call",
                        "call_id": call["call_id"],
                        "name": call["name"],
                        "arguments": call["arguments"],
                    },
                    {"type": "function_call_output", "call_id": call["call_id"], "output": result},
                ],
                "tools": [WEATHER_FUNCTION],
                "temperature": 0,
            },
            strict=False,
        ),
    )
    assert text_of(second) == "It is sunny in Paris with a temperature of 21 degrees."


async def test_json_output(lmsp_service: LmspServiceHandle, connect: Factory) -> None:
    provider, _ = await connect()
    request = make_request(
        lmsp_service,
        "Return a JSON object with name Alice and age 30.",
        stream=True,
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "person", "schema": PERSON_SCHEMA},
        },
    )
    events = await run(provider, request)
    assert json.loads(text_of(events)) == {"name": "Alice", "age": 30}


@pytest.mark.parametrize("stream", [True, False])
async def test_max_output_tokens_gives_incomplete(
    lmsp_service: LmspServiceHandle, connect: Factory, stream: bool
) -> None:
    provider, _ = await connect()
    events = await run(provider, make_request(lmsp_service, max_output_tokens=3, stream=stream))
    assert events[-1].event == "response.incomplete"
    assert events[-1].data["incomplete_details"] == {"reason": "max_output_tokens"}
    assert HELLO_ANSWER.startswith(text_of(events))


def long_request(service: LmspServiceHandle, **fields: Any) -> LmspRequest:
    limit = 4000
    return make_request(
        service,
        max_output_tokens=limit,
        extensions={"min_output_tokens": limit},
        stream=True,
        **fields,
    )


async def wait_status(service: LmspServiceHandle, path: str) -> dict[str, Any]:
    async with httpx.AsyncClient(base_url=service.api, headers=service.headers()) as client:
        for _ in range(600):
            body: dict[str, Any] = (await client.get(path)).json()
            if body["status"] not in ("queued", "in_progress"):
                return body
            await asyncio.sleep(0.05)
    return body


async def test_cancel_sends_the_task_cancel(
    lmsp_service: LmspServiceHandle, connect: Factory
) -> None:
    provider, port = await connect(resumable=True)
    seen_text = asyncio.Event()

    async def consume() -> None:
        async for event in provider.respond(long_request(lmsp_service)):
            if event.event == "response.output_text.delta":
                seen_text.set()

    job = asyncio.create_task(consume())
    await asyncio.wait_for(seen_text.wait(), LIMIT_S)
    job.cancel()
    with pytest.raises(asyncio.CancelledError):
        await job
    await provider.join_background(timeout_s=LIMIT_S)
    method, url, _ = port.seen[-1]
    assert method == "POST" and url.endswith("/cancel")
    task_path = url.removeprefix(lmsp_service.api).removesuffix("/cancel")
    task = await wait_status(lmsp_service, task_path)
    assert task["status"] == "cancelled"
    assert task["response"]["usage"]["output_tokens"] < 4000


async def test_closing_a_direct_stream_stops_generation(
    lmsp_service: LmspServiceHandle, connect: Factory
) -> None:
    provider, _ = await connect()
    iterator = provider.respond(long_request(lmsp_service, store=True))
    created = await asyncio.wait_for(anext(iterator), LIMIT_S)
    await iterator.aclose()  # type: ignore[attr-defined]
    stored = await wait_status(lmsp_service, f"/responses/{created.data['response_id']}")
    assert stored["status"] == "cancelled"


async def test_dropped_connection_is_resumed_with_last_event_id(
    lmsp_service: LmspServiceHandle, connect: Factory
) -> None:
    provider, port = await connect(resumable=True, cut_after_events=3)
    events = await run(provider, make_request(lmsp_service, stream=True))
    ids = [e.id for e in events]
    assert ids == list(range(1, len(events) + 1))  # nothing lost, nothing repeated
    assert deltas(events) == text_of(events) == HELLO_ANSWER
    event_reads = [(url, headers) for method, url, headers in port.seen if "/events" in url]
    assert len(event_reads) == 2
    url, headers = event_reads[1]
    assert headers["Last-Event-ID"] == "3" and url.endswith("?after=3")


async def test_expired_history_is_completed_from_the_task(
    lmsp_service: LmspServiceHandle, connect: Factory
) -> None:
    async def slow_sleep(seconds: float) -> None:
        await asyncio.sleep(lmsp_service.retention_s + 0.6)  # let the events expire

    provider, port = await connect(resumable=True, cut_after_events=3, sleep=slow_sleep)
    events = await run(provider, make_request(lmsp_service, stream=True))
    names = [e.event for e in events]
    assert names.count("response.created") == 1
    assert names.count("response.output_item.added") == 1
    assert names[-1] == "response.completed"
    assert text_of(events) == HELLO_ANSWER
    assert HELLO_ANSWER.startswith(deltas(events))  # no delta repeated
    assert port.seen[-1][0] == "GET" and "/tasks/" in port.seen[-1][1]
    assert not port.seen[-1][1].endswith("/events")


async def test_wrong_token(lmsp_service: LmspServiceHandle, connect: Factory) -> None:
    provider, _ = await connect(credential="not-the-token-" + uuid.uuid4().hex)
    with pytest.raises(ProviderFailure) as info:
        await run(provider, make_request(lmsp_service, stream=True))
    assert info.value.code is ErrorCode.PROVIDER_ERROR
    assert info.value.user_hint == TOKEN_REJECTED_HINT
    assert info.value.to_nap_error().message == SAFE_MESSAGES[ErrorCode.PROVIDER_ERROR]
    assert "not-the-token" not in str(info.value.__dict__)


async def test_duplicate_idempotency_key(lmsp_service: LmspServiceHandle, connect: Factory) -> None:
    key = f"key-{uuid.uuid4()}"
    provider, _ = await connect(idempotency_key=lambda: key)
    first = await run(provider, make_request(lmsp_service))
    again = await run(provider, make_request(lmsp_service))
    assert again[0].data["response_id"] == first[0].data["response_id"]  # replayed, not rerun
    assert text_of(again) == HELLO_ANSWER
    with pytest.raises(ProviderFailure) as info:
        await run(provider, make_request(lmsp_service, "Who are you?"))
    assert info.value.code is ErrorCode.PROVIDER_ERROR
    assert info.value.detail is not None and "idempotency_conflict" in info.value.detail


async def test_problems_from_the_service(lmsp_service: LmspServiceHandle, connect: Factory) -> None:
    provider, _ = await connect()
    with pytest.raises(ProviderFailure) as info:
        await run(provider, make_request(lmsp_service, "Hello! " * lmsp_service.n_ctx))
    assert info.value.code is ErrorCode.UNSUPPORTED
    assert info.value.to_nap_error().message == CONTEXT_TOO_LONG
    image = {"type": "input_image", "mime_type": "image/png", "data": "iVBORw0KGgo="}
    request = LmspRequest.model_validate(
        {
            "model": lmsp_service.model_id,
            "input": [{"type": "message", "role": "user", "content": [image]}],
        },
        strict=False,
    )
    with pytest.raises(ProviderFailure) as info:
        await run(provider, request)
    assert info.value.code is ErrorCode.UNSUPPORTED


async def test_discovery(lmsp_service: LmspServiceHandle) -> None:
    async with httpx.AsyncClient() as client:
        entries = await discover_models(
            HttpxPort(client), lmsp_service.base_url, lmsp_service.token
        )
    (entry,) = entries
    assert entry.id == lmsp_service.model_id
    caps = capabilities_from_entry(entry)
    assert caps.tools and caps.json_output and not caps.images
    assert caps.tool_choice_modes == ("auto", "none", "required", "tool")
