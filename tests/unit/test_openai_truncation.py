"""A server that cuts the prompt to its context is never a success (NAP-LLM, Errors).

Fake OpenAI-compatible servers (httpx.MockTransport) of each kind: one that
flags the cut (`"truncated": true`), one whose model listing reports its
window and whose usage then shows the prompt filled it, one that reports
nothing (the cut cannot be seen: documented in docs/security.md).
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from fixtures import lmsp_request
from napllm.errors import ErrorCode, ProviderFailure
from napllm.lmsp import LmspEvent
from napllm.providers.http_httpx import HttpxPort
from napllm.providers.openai_compat import (
    CONTEXT_TOO_LONG,
    OpenAICompatProvider,
    context_window_of,
    model_context_window,
)

#: The hold-out prompt: 30,067 characters, far beyond a 2,048-token window.
LONG_TEXT = ("The quick brown fox jumps over the lazy dog. " * 700)[:30067]
WINDOW = 2048


def long_request() -> Any:
    return lmsp_request(
        "tiny",
        input=[
            {
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": LONG_TEXT}],
            }
        ],
    )


def chunk(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> dict[str, Any]:
    return {"choices": [{"index": 0, "delta": delta, "finish_reason": finish}], **extra}


def sse(*chunks: object) -> bytes:
    return ("".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n").encode()


class FakeServer:
    """An OpenAI-compatible server: `/v1/models` lists `entry`; chat answers `stream`."""

    def __init__(self, stream: bytes | None, entry: dict[str, Any], completion: Any = None):
        self.stream, self.entry, self.completion = stream, entry, completion

    async def __call__(self, req: httpx.Request) -> httpx.Response:
        if req.url.path == "/v1/models":
            return httpx.Response(200, json={"object": "list", "data": [self.entry]})
        if self.completion is not None:
            return httpx.Response(200, json=self.completion)
        return httpx.Response(
            200, headers={"content-type": "text/event-stream"}, content=self.stream
        )

    def port(self) -> HttpxPort:
        return HttpxPort(httpx.AsyncClient(transport=httpx.MockTransport(self)))


def answer(usage: dict[str, int], **extra: Any) -> bytes:
    return sse(
        chunk({"role": "assistant", "content": "A fox."}),
        chunk({}, "stop"),
        {"choices": [], "usage": usage, **extra},
    )


async def run(server: FakeServer, window: int | None) -> list[LmspEvent]:
    provider = OpenAICompatProvider(
        server.port(), "http://127.0.0.1:9", None, context_window=window
    )
    return [e async for e in provider.respond(long_request())]


def assert_context_failure(exc: ProviderFailure) -> None:
    assert exc.code is ErrorCode.UNSUPPORTED
    assert exc.to_nap_error().message == CONTEXT_TOO_LONG


async def test_a_server_that_flags_the_cut_ends_with_an_explicit_error() -> None:
    usage = {"prompt_tokens": 1500, "completion_tokens": 3}
    server = FakeServer(answer(usage, truncated=True), {"id": "tiny"})
    with pytest.raises(ProviderFailure) as caught:
        await run(server, None)
    assert_context_failure(caught.value)


async def test_usage_filling_the_listed_window_ends_with_an_explicit_error() -> None:
    # The hold-out server: 30,067 characters answered with prompt_tokens == its window.
    usage = {"prompt_tokens": WINDOW, "completion_tokens": 3}
    server = FakeServer(answer(usage), {"id": "tiny", "object": "model", "context_length": WINDOW})
    window = await model_context_window(server.port(), "http://127.0.0.1:9", None, "tiny")
    assert window == WINDOW
    with pytest.raises(ProviderFailure) as caught:
        await run(server, window)
    assert_context_failure(caught.value)


async def test_a_whole_json_completion_is_checked_the_same_way() -> None:
    completion = {
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "A fox."},
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": WINDOW - 1, "completion_tokens": 5},
    }
    server = FakeServer(None, {"id": "tiny"}, completion=completion)
    with pytest.raises(ProviderFailure) as caught:
        await run(server, WINDOW)
    assert_context_failure(caught.value)


async def test_a_prompt_that_fits_completes() -> None:
    usage = {"prompt_tokens": 900, "completion_tokens": 3}
    events = await run(FakeServer(answer(usage), {"id": "tiny"}), WINDOW)
    assert events[-1].event == "response.completed"


async def test_a_silent_cut_without_a_known_window_cannot_be_seen() -> None:
    # Documented limit: no flag, no window, nothing to compare the usage with.
    usage = {"prompt_tokens": WINDOW, "completion_tokens": 3}
    events = await run(FakeServer(answer(usage), {"id": "tiny"}), None)
    assert events[-1].event == "response.completed"


@pytest.mark.parametrize(
    ("entry", "window"),
    [
        ({"id": "m", "context_length": 4096}, 4096),
        ({"id": "m", "max_model_len": 8192}, 8192),
        ({"id": "m", "max_context_length": 1024}, 1024),
        ({"id": "m", "meta": {"n_ctx_train": 131072, "n_ctx": 2048}}, 2048),
        ({"id": "m", "meta": {"n_ctx_train": 131072}}, None),  # training size, not the window
        ({"id": "m", "context_length": True}, None),
        ({"id": "m", "context_length": 0}, None),
        ({"id": "m", "context_length": 10**12}, None),
        ({"id": "m", "context_length": "4096"}, None),
        ("not an entry", None),
    ],
)
def test_the_window_a_listing_reports(entry: Any, window: int | None) -> None:
    assert context_window_of(entry) == window


async def test_an_unreachable_listing_leaves_the_window_unknown() -> None:
    async def refuse(req: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused")

    port = HttpxPort(httpx.AsyncClient(transport=httpx.MockTransport(refuse)))
    assert await model_context_window(port, "http://127.0.0.1:9", None, "tiny") is None
