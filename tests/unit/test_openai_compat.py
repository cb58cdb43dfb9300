"""The OpenAI-compatible provider against in-process fake servers (httpx.MockTransport)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import httpx
import pytest

import fixtures
from fixtures import WEATHER_FUNCTION, lmsp_request
from napllm.errors import SAFE_MESSAGES, ErrorCode, ProviderFailure
from napllm.kinds import MAX_LISTED_MODELS
from napllm.lmsp import LmspEvent, LmspRequest
from napllm.providers.http_httpx import HttpxPort
from napllm.providers.openai_compat import (
    CONNECTION_LOST_HINT,
    CONTEXT_TOO_LONG,
    KEY_REJECTED_HINT,
    UNREACHABLE_HINT,
    OpenAICompatProvider,
    api_root,
    discover_models,
)

KEY = "sk-proj-SECRET-777"


def request(**fields: Any) -> LmspRequest:
    return lmsp_request("tiny", **fields)


def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    return {
        "id": "c",
        "object": "chat.completion.chunk",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }


def sse(*chunks: object, done: bool = True) -> bytes:
    text = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks)
    return (text + ("data: [DONE]\n\n" if done else "")).encode()


class Body(fixtures.Body):
    drop_error = httpx.RemoteProtocolError


Handler = Callable[[httpx.Request], Awaitable[httpx.Response]]


def provider(
    handler: Handler, seen: list[httpx.Request] | None = None, **options: Any
) -> OpenAICompatProvider:
    async def recording(req: httpx.Request) -> httpx.Response:
        if seen is not None:
            seen.append(req)
        return await handler(req)

    client = httpx.AsyncClient(transport=httpx.MockTransport(recording))
    return OpenAICompatProvider(HttpxPort(client), "http://127.0.0.1:9", KEY, **options)


def streaming(body: Body) -> Handler:
    async def handler(req: httpx.Request) -> httpx.Response:
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, stream=body)

    return handler


async def collect(p: OpenAICompatProvider, req: LmspRequest | None = None) -> list[LmspEvent]:
    return [e async for e in p.respond(req or request())]


def assert_no_leak(exc: ProviderFailure) -> None:
    for text in (str(exc), exc.to_nap_error().message, exc.user_hint or "", exc.detail or ""):
        assert KEY not in text and "diary" not in text


async def test_streams_text_and_sends_the_chat_body() -> None:
    seen: list[httpx.Request] = []
    body = sse(
        chunk({"role": "assistant"}),
        chunk({"content": "Hel"}),
        chunk({"content": "lo"}),
        chunk({}, "stop"),
    )
    events = await collect(
        provider(streaming(Body(body[:13], body[13:])), seen), request(max_output_tokens=9)
    )
    assert [e.event for e in events][-2:] == ["response.output_item.done", "response.completed"]
    assert events[-2].data["item"]["content"] == [{"type": "output_text", "text": "Hello"}]
    sent = seen[0]
    assert sent.url.path == "/v1/chat/completions"
    assert sent.headers["authorization"] == f"Bearer {KEY}"
    payload = json.loads(sent.content)
    assert payload["stream"] is True and payload["stream_options"] == {"include_usage": True}
    assert payload["max_tokens"] == 9
    assert payload["messages"] == [{"role": "user", "content": "Hi"}]


async def test_no_authorization_without_a_key() -> None:
    seen: list[httpx.Request] = []

    async def handler(req: httpx.Request) -> httpx.Response:
        seen.append(req)
        return httpx.Response(
            200, headers={"content-type": "text/event-stream"}, content=sse(chunk({}, "stop"))
        )

    client = httpx.AsyncClient(transport=httpx.MockTransport(handler))
    p = OpenAICompatProvider(HttpxPort(client), "http://127.0.0.1:9/v1/")
    await collect(p)
    assert "authorization" not in seen[0].headers
    assert seen[0].url.path == "/v1/chat/completions"


async def test_tool_call_blocks_are_parsed_when_tools_are_offered() -> None:
    block = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Berlin"}}\n</tool_call>'
    body = sse(
        *[chunk({"content": block[i : i + 4]}) for i in range(0, len(block), 4)], chunk({}, "stop")
    )
    events = await collect(provider(streaming(Body(body))), request(tools=[WEATHER_FUNCTION]))
    calls = [e.data["item"] for e in events if e.event == "response.output_item.done"]
    assert calls[0]["type"] == "function_call"
    assert json.loads(calls[0]["arguments"]) == {"city": "Berlin"}
    # without tools the same content is text
    events = await collect(provider(streaming(Body(body))))
    done = [e.data["item"] for e in events if e.event == "response.output_item.done"]
    assert done[0]["content"][0]["text"] == block


async def test_missing_finish_reason_gives_no_terminal_event() -> None:
    events = await collect(provider(streaming(Body(sse(chunk({"content": "Hi"}))))))
    assert not any(e.terminal for e in events)


async def test_stream_ending_without_done_still_finishes() -> None:
    events = await collect(
        provider(streaming(Body(sse(chunk({"content": "Hi"}, "stop"), done=False))))
    )
    assert events[-1].event == "response.completed"


async def test_json_answer_instead_of_a_stream() -> None:
    completion = {
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}
        ],
        "usage": {"prompt_tokens": 2, "completion_tokens": 1},
    }

    async def handler(req: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json=completion)

    events = await collect(provider(handler))
    assert events[-1].data["usage"] == {"input_tokens": 2, "output_tokens": 1, "total_tokens": 3}


@pytest.mark.parametrize(
    ("response", "code", "message", "hint"),
    [
        (
            httpx.Response(
                401,
                json={
                    "error": {
                        "message": f"Incorrect API key {KEY}",
                        "type": "invalid_request_error",
                        "code": "invalid_api_key",
                    }
                },
            ),
            ErrorCode.PROVIDER_ERROR,
            SAFE_MESSAGES[ErrorCode.PROVIDER_ERROR],
            KEY_REJECTED_HINT,
        ),
        (
            httpx.Response(
                400,
                json={
                    "error": {"message": "my diary is too long", "code": "context_length_exceeded"}
                },
            ),
            ErrorCode.UNSUPPORTED,
            CONTEXT_TOO_LONG,
            None,
        ),
        (
            httpx.Response(
                400,
                json={
                    "error": {
                        "code": 400,
                        "message": "my diary",
                        "type": "exceed_context_size_error",
                    }
                },
            ),
            ErrorCode.UNSUPPORTED,
            CONTEXT_TOO_LONG,
            None,
        ),
        (
            httpx.Response(429, json={"error": {"message": "slow down", "type": "rate_limit"}}),
            ErrorCode.QUOTA_EXCEEDED,
            SAFE_MESSAGES[ErrorCode.QUOTA_EXCEEDED],
            None,
        ),
        (
            httpx.Response(404, json={"error": "model 'my diary' not found, try pulling it first"}),
            ErrorCode.PROVIDER_ERROR,
            SAFE_MESSAGES[ErrorCode.PROVIDER_ERROR],
            "The model server does not serve the selected model.",
        ),
        (
            httpx.Response(500, text=f"Traceback ... {KEY} ... my diary"),
            ErrorCode.PROVIDER_ERROR,
            SAFE_MESSAGES[ErrorCode.PROVIDER_ERROR],
            None,
        ),
    ],
)
async def test_error_answers_are_safe_failures(
    response: httpx.Response, code: ErrorCode, message: str, hint: str | None
) -> None:
    async def handler(req: httpx.Request) -> httpx.Response:
        return response

    with pytest.raises(ProviderFailure) as info:
        await collect(provider(handler))
    assert info.value.code is code
    assert info.value.to_nap_error().message == message
    assert info.value.user_hint == hint
    assert_no_leak(info.value)


@pytest.mark.parametrize(
    "error_chunk",
    [
        b'data: {"error": {"message": "my diary broke the server", "code": 500}}\n\n',
        b'data: {"error": "my diary: unexpected EOF"}\n\n',
        b'event: error\ndata: {"message": "my diary"}\n\n',
        b"data: not json my diary\n\n",
    ],
)
async def test_mid_stream_errors_are_safe_failures(error_chunk: bytes) -> None:
    body = Body(sse(chunk({"content": "Hi"}), done=False), error_chunk, sse(chunk({}, "stop")))
    with pytest.raises(ProviderFailure) as info:
        await collect(provider(streaming(body)))
    assert info.value.code is ErrorCode.PROVIDER_ERROR
    assert_no_leak(info.value)
    assert body.closed


async def test_unreachable_and_cut_off() -> None:
    async def refused(req: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused")

    with pytest.raises(ProviderFailure) as info:
        await collect(provider(refused))
    assert info.value.user_hint == UNREACHABLE_HINT
    with pytest.raises(ProviderFailure) as info:
        await collect(
            provider(streaming(Body(sse(chunk({"content": "Hi"}), done=False), drop=True)))
        )
    assert info.value.user_hint == CONNECTION_LOST_HINT


async def test_a_stream_line_that_never_ends_is_a_provider_error() -> None:
    class Endless(Body):
        async def __aiter__(self) -> AsyncIterator[bytes]:
            yield b'data: {"choices": [{"index": 0, "delta": {"content": "'
            for _ in range(64):  # "without end": 64 MiB, so a regression fails, not hangs
                yield b"x" * (1024 * 1024)
                await asyncio.sleep(0)

    body = Endless()
    with pytest.raises(ProviderFailure) as info:
        await collect(provider(streaming(body)))
    assert info.value.code is ErrorCode.PROVIDER_ERROR
    assert_no_leak(info.value)
    assert body.closed


async def test_cancel_closes_the_stream() -> None:
    body = Body(sse(chunk({"content": "Hi"}), done=False), hang=True)
    p = provider(streaming(body))
    got: list[LmspEvent] = []

    async def consume() -> None:
        async for event in p.respond(request()):
            got.append(event)

    job = asyncio.create_task(consume())
    while len(got) < 3:
        await asyncio.sleep(0)
    job.cancel()
    with pytest.raises(asyncio.CancelledError):
        await job
    assert body.closed


async def test_discover_models() -> None:
    listing = {
        "object": "list",
        "data": [{"id": "a"}, {"id": "b"}, {"id": "a"}, {"x": 1}, {"id": ""}]
        + [{"id": "gpt\u202e4o"}, {"id": "x" * 201}, {"id": "z\u200b"}]
        + [{"id": f"m{i}"} for i in range(500)],
    }

    async def handler(req: httpx.Request) -> httpx.Response:
        assert req.url.path == "/v1/models"
        return httpx.Response(200, json=listing)

    client = httpx.AsyncClient(transport=httpx.MockTransport(handler))
    found = await discover_models(HttpxPort(client), "http://127.0.0.1:9", KEY)
    assert found[:3] == ["a", "b", "m0"]
    assert len(found) == MAX_LISTED_MODELS

    async def denied(req: httpx.Request) -> httpx.Response:
        return httpx.Response(401, json={"error": {"message": KEY}})

    client = httpx.AsyncClient(transport=httpx.MockTransport(denied))
    with pytest.raises(ProviderFailure) as info:
        await discover_models(HttpxPort(client), "http://127.0.0.1:9", KEY)
    assert info.value.user_hint == KEY_REJECTED_HINT
    assert_no_leak(info.value)


def test_api_root() -> None:
    assert api_root("http://h:1") == "http://h:1/v1"
    assert api_root("http://h:1/v1/") == "http://h:1/v1"


async def test_keep_alives_comments_retry_and_unknown_events_are_ignored() -> None:
    noise = (
        b"data: \n\n"  # empty data, as some proxies send before the first chunk
        b"data:\n\n"
        b"data:   \n\n"
        b": keep-alive comment\n\n"
        b"retry: 3000\n\n"
        b'event: ping\ndata: {"type": "ping"}\n\n'
        b"event: heartbeat\ndata: not even json\n\n"
    )
    body = Body(noise, sse(chunk({"content": "Hi"}), done=False), noise, sse(chunk({}, "stop")))
    events = await collect(provider(streaming(body)))
    assert events[-2].data["item"]["content"] == [{"type": "output_text", "text": "Hi"}]
    assert events[-1].event == "response.completed"


async def test_done_is_never_parsed_as_json() -> None:
    body = Body(sse(chunk({"content": "Hi"}, "stop"), done=False), b"data:  [DONE]  \n\n", b"{{{")
    events = await collect(provider(streaming(body)))
    assert events[-1].event == "response.completed"


@pytest.mark.parametrize(
    "payload",
    [
        b'{"choices": [{"index": 0, "delta": {"content": "x"}, "finish_reason": null}], "n": NaN}',
        b'{"choices": [], "n": 1e400}',
        b'{"choices": [], "choices": []}',
        b'{"d": ' + b"[" * 10_000 + b"]" * 10_000 + b"}",
    ],
    ids=["nan", "overflow", "duplicate-key", "deep"],
)
async def test_chunks_that_are_not_strict_json_are_provider_errors(payload: bytes) -> None:
    body = Body(sse(chunk({"content": "Hi"}), done=False), b"data: " + payload + b"\n\n")
    with pytest.raises(ProviderFailure) as info:
        await collect(provider(streaming(body)))
    assert info.value.code is ErrorCode.PROVIDER_ERROR


async def test_local_network_refusal_gets_its_own_hint() -> None:
    from napllm.providers.base import LOCAL_NETWORK_HINT, LocalNetworkBlocked
    from napllm.providers.lmsp_client import LmspProvider

    class Blocked:
        async def request(self, method: str, url: str, **options: Any) -> Any:
            raise LocalNetworkBlocked("refused by the browser")

    with pytest.raises(ProviderFailure) as info:
        await collect(OpenAICompatProvider(Blocked(), "http://127.0.0.1:9"))
    assert info.value.user_hint == LOCAL_NETWORK_HINT
    assert info.value.code is ErrorCode.PROVIDER_ERROR
    with pytest.raises(ProviderFailure) as info:
        await discover_models(Blocked(), "http://127.0.0.1:9", None)
    assert info.value.user_hint == LOCAL_NETWORK_HINT
    with pytest.raises(ProviderFailure) as info:
        [e async for e in LmspProvider(Blocked(), "http://127.0.0.1:9").respond(request())]
    assert info.value.user_hint == LOCAL_NETWORK_HINT
