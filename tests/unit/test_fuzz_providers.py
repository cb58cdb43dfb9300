"""Fuzzing provider output (hypothesis): corrupted recorded streams through the real
adapters and the shell.

One recorded stream per provider kind (an OpenAI-compatible SSE body, an
LMSP SSE body, WebLLM chunk batches, wllama chunk batches) is corrupted at
the byte level (bytes flipped, removed, inserted, repeated, the stream cut)
and cut into arbitrary pieces, then read by the real adapter
(`OpenAICompatProvider`, `LmspProvider`, `providers.engine.read_stream`
with the engine bridge replaced by a fake) behind the real `Shell`.

Properties, for every corruption:
- the request gets exactly one terminal result, deltas are contiguous and
  follow the block rules (`envelope_rules.check_generation`);
- no exception escapes and nothing is logged as a runtime failure (every
  fault is a typed `ProviderFailure` or `NapError`);
- nothing a napplet receives holds a lone surrogate or a value JSON cannot
  carry (every envelope encodes as strict JSON in UTF-8).

CI runs a modest number of examples per kind; `pytest -m fuzz_long` runs
thousands.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import pytest
from harness import Harness, generate
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import envelope_rules
from fixtures import WEATHER_TOOL
from napllm.lmsp import LmspEvent, LmspRequest
from napllm.providers.chat_stream import ChatStreamToLmsp
from napllm.providers.engine import read_stream
from napllm.providers.http_httpx import HttpxPort
from napllm.providers.lmsp_client import LmspProvider
from napllm.providers.openai_compat import OpenAICompatProvider

# --------------------------------------------------------------------------
# recorded streams


def _chat(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        **extra,
    }


CHAT_CHUNKS: list[dict[str, Any]] = [
    _chat({"role": "assistant", "content": ""}),
    _chat({"reasoning_content": "Think \ud83e"}),
    _chat({"reasoning_content": "\udd14 hard."}),
    _chat({"content": "Sunny \ud83d"}),
    _chat({"content": "\ude00 in Paris."}),
    _chat(
        {
            "tool_calls": [
                {
                    "index": 0,
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city":'},
                }
            ]
        }
    ),
    _chat({"tool_calls": [{"index": 0, "function": {"arguments": ' "Paris"}'}}]}),
    _chat({}, "tool_calls"),
    {"id": "chatcmpl-1", "choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 7}},
]

OPENAI_SSE = (
    b": keep-alive\n\ndata: \n\n"
    + "".join(f"data: {json.dumps(c)}\n\n" for c in CHAT_CHUNKS).encode()
    + b"data: [DONE]\n\n"
)

_MSG = {"id": "msg_1", "type": "message", "role": "assistant"}
_CALL = {"id": "fc_1", "type": "function_call", "call_id": "call_1", "name": "get_weather"}
LMSP_EVENTS: list[tuple[str, dict[str, Any]]] = [
    ("response.created", {"status": "in_progress"}),
    ("response.output_item.added", {"output_index": 0, "item": {**_MSG, "content": []}}),
    ("response.output_text.delta", {"item_id": "msg_1", "output_index": 0, "delta": "Hi \ud83d"}),
    ("response.output_item.added", {"output_index": 1, "item": {**_CALL, "arguments": ""}}),
    (
        "response.function_call_arguments.delta",
        {"item_id": "fc_1", "output_index": 1, "delta": '{"city": "Oslo"}'},
    ),
    (
        "response.output_item.done",
        {"output_index": 1, "item": {**_CALL, "arguments": '{"city": "Oslo"}'}},
    ),
    ("response.output_text.delta", {"item_id": "msg_1", "output_index": 0, "delta": "\ude00"}),
    (
        "response.output_item.done",
        {
            "output_index": 0,
            "item": {**_MSG, "content": [{"type": "output_text", "text": "Hi \ud83d\ude00"}]},
        },
    ),
    (
        "response.completed",
        {
            "status": "completed",
            "usage": {"input_tokens": 3, "output_tokens": 5, "total_tokens": 8},
        },
    ),
]
LMSP_SSE = (
    b"event: heartbeat\ndata: {}\n\n"
    + "".join(
        f"id: {n}\nevent: {name}\ndata: {json.dumps({'response_id': 'resp_1', **data})}\n\n"
        for n, (name, data) in enumerate(LMSP_EVENTS, start=1)
    ).encode()
)

_WEBLLM_CALLS = '[{"name": "get_weather", "arguments": {"city": "Rome"}}]'
WEBLLM_BATCHES = [
    json.dumps({"chunks": [_chat({"content": _WEBLLM_CALLS[:12]})], "done": False}),
    json.dumps({"chunks": [_chat({"content": _WEBLLM_CALLS[12:]})], "done": False}),
    json.dumps(
        {
            "chunks": [
                _chat(
                    {
                        "role": "assistant",
                        "tool_calls": [
                            {
                                "index": 0,
                                "type": "function",
                                "function": {
                                    "name": "get_weather",
                                    "arguments": '{"city": "Rome"}',
                                },
                            }
                        ],
                    },
                    "tool_calls",
                )
            ],
            "done": True,
        }
    ),
]
_BLOCK = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Lima"}}\n</tool_call>'
WLLAMA_BATCHES = [
    json.dumps({"chunks": [_chat({"content": "Ok \ud83d"})], "done": False}),
    json.dumps({"chunks": [_chat({"content": "\ude00 " + _BLOCK[:20]})], "done": False}),
    json.dumps({"chunks": [_chat({"content": _BLOCK[20:]}), _chat({}, "stop")], "done": True}),
]

# --------------------------------------------------------------------------
# byte-level corruption


@st.composite
def corrupted(draw: st.DrawFn, data: bytes) -> bytes:
    """`data` with up to four byte-level faults."""
    out = bytearray(data)
    for _ in range(draw(st.integers(0, 4))):
        if not out:
            break
        at = draw(st.integers(0, len(out) - 1))
        kind = draw(st.sampled_from(["flip", "delete", "insert", "repeat", "cut"]))
        if kind == "flip":
            out[at] = draw(st.integers(0, 255))
        elif kind == "delete":
            del out[at : at + draw(st.integers(1, 8))]
        elif kind == "insert":
            out[at:at] = draw(
                st.one_of(
                    st.binary(min_size=1, max_size=6),
                    st.sampled_from(
                        [b"\n\n", b"\\ud83d", b"[" * 64, b"NaN", b"1e400", b'"', b"\xed\xa0\xbd"]
                    ),
                )
            )
        elif kind == "repeat":
            end = min(len(out), at + draw(st.integers(1, 200)))
            out[at:at] = out[at:end]
        else:
            del out[at:]
    return bytes(out)


def pieces(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts} | {0, len(data)})
    return [data[a:b] for a, b in itertools.pairwise(points) if b > a]


# --------------------------------------------------------------------------
# adapters


class Body(httpx.AsyncByteStream):
    def __init__(self, chunks: list[bytes]) -> None:
        self.chunks = chunks

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for chunk in self.chunks:
            yield chunk

    async def aclose(self) -> None:
        pass


def http_port(chunks: list[bytes]) -> HttpxPort:
    async def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(
            200, headers={"content-type": "text/event-stream"}, stream=Body(chunks)
        )

    return HttpxPort(httpx.AsyncClient(transport=httpx.MockTransport(handler)))


class FakeEngineBridge:
    """The engine bridge's `next_chunks` / `abort`, playing batch texts."""

    def __init__(self, batches: list[str]) -> None:
        self.batches = list(batches)

    async def next_chunks(self, stream_id: str) -> str:
        if self.batches:
            return self.batches.pop(0)
        return json.dumps({"chunks": [], "done": True})

    def abort(self, stream_id: str) -> None:
        self.batches = []


class EngineProvider:
    """The engine providers' streaming half, on a fake engine bridge."""

    def __init__(self, batches: list[str], **mapping: Any) -> None:
        self.batches = batches
        self.mapping = mapping

    async def respond(self, request: LmspRequest) -> AsyncIterator[LmspEvent]:
        state = ChatStreamToLmsp(**self.mapping)
        async for event in read_stream(FakeEngineBridge(self.batches), "s1", state, "engine"):
            yield event


# --------------------------------------------------------------------------
# the property


class ErrorLog(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


async def through_shell(provider: Any) -> dict[str, Any]:
    log = ErrorLog()
    logging.getLogger("napllm").addHandler(log)
    try:
        h = Harness()
        h.connect()
        h.shell._providers = lambda connection: provider
        ep = h.endpoint()
        handle = await h.select(ep)
        h.send(ep, generate("g1", handle, tools=[WEATHER_TOOL]))
        await h.settle()
        envelopes = h.out(ep)
        result = envelope_rules.check_generation(envelopes, "g1")
        json.dumps(envelopes, ensure_ascii=False, allow_nan=False).encode("utf-8")
        assert not log.records, [r.getMessage() for r in log.records]
        return result
    finally:
        logging.getLogger("napllm").removeHandler(log)


def run(provider: Any) -> dict[str, Any]:
    return asyncio.run(through_shell(provider))


CUTS = st.lists(st.integers(0, 10_000), max_size=6)
FEW = settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
MANY = settings(max_examples=2_000, deadline=None, suppress_health_check=list(HealthCheck))


def openai_provider(data: bytes, cuts: list[int]) -> OpenAICompatProvider:
    return OpenAICompatProvider(http_port(pieces(data, cuts)), "http://127.0.0.1:9")


def lmsp_provider(data: bytes, cuts: list[int]) -> LmspProvider:
    return LmspProvider(http_port(pieces(data, cuts)), "http://127.0.0.1:9")


def batches_of(data: list[bytes]) -> list[str]:
    return [b.decode("utf-8", "replace") for b in data]


def engine_case(
    recorded: list[str], mapping: dict[str, Any]
) -> Callable[[list[bytes]], EngineProvider]:
    def build(data: list[bytes]) -> EngineProvider:
        return EngineProvider(batches_of(data), **mapping)

    return build


WEBLLM = engine_case(WEBLLM_BATCHES, {"tool_text_in_content": True})
WLLAMA = engine_case(WLLAMA_BATCHES, {"parse_tool_call_blocks": True})


def test_the_recorded_streams_are_valid_and_complete() -> None:
    call = {"type": "toolCall", "name": "get_weather"}
    openai = run(openai_provider(OPENAI_SSE, []))["result"]["content"]
    assert openai[:2] == [
        {"type": "thinking", "text": "Think \U0001f914 hard."},
        {"type": "text", "text": "Sunny \U0001f600 in Paris."},
    ]
    assert openai[2] == {**call, "toolCallId": "call_1", "arguments": {"city": "Paris"}}
    lmsp = run(lmsp_provider(LMSP_SSE, []))["result"]["content"]
    assert lmsp == [
        {"type": "text", "text": "Hi \U0001f600"},
        {**call, "toolCallId": "call_1", "arguments": {"city": "Oslo"}},
    ]
    webllm = run(WEBLLM([b.encode() for b in WEBLLM_BATCHES]))["result"]
    assert [(p["type"], p.get("arguments")) for p in webllm["content"]] == [
        ("toolCall", {"city": "Rome"})
    ]
    wllama = run(WLLAMA([b.encode() for b in WLLAMA_BATCHES]))["result"]
    assert wllama["content"][0] == {"type": "text", "text": "Ok \U0001f600 "}
    assert wllama["content"][1]["arguments"] == {"city": "Lima"}


@FEW
@given(data=corrupted(OPENAI_SSE), cuts=CUTS)
def test_corrupted_openai_sse(data: bytes, cuts: list[int]) -> None:
    run(openai_provider(data, cuts))


@FEW
@given(data=corrupted(LMSP_SSE), cuts=CUTS)
def test_corrupted_lmsp_sse(data: bytes, cuts: list[int]) -> None:
    run(lmsp_provider(data, cuts))


def engine_batches(recorded: list[str]) -> st.SearchStrategy[list[bytes]]:
    return st.tuples(*[corrupted(b.encode()) for b in recorded]).map(list)


@FEW
@given(data=engine_batches(WEBLLM_BATCHES))
def test_corrupted_webllm_chunks(data: list[bytes]) -> None:
    run(WEBLLM(data))


@FEW
@given(data=engine_batches(WLLAMA_BATCHES))
def test_corrupted_wllama_chunks(data: list[bytes]) -> None:
    run(WLLAMA(data))


@pytest.mark.fuzz_long
@MANY
@given(
    kind=st.sampled_from(["openai", "lmsp"]),
    openai=corrupted(OPENAI_SSE),
    lmsp=corrupted(LMSP_SSE),
    cuts=CUTS,
)
def test_corrupted_sse_long(kind: str, openai: bytes, lmsp: bytes, cuts: list[int]) -> None:
    run(openai_provider(openai, cuts) if kind == "openai" else lmsp_provider(lmsp, cuts))


@pytest.mark.fuzz_long
@MANY
@given(webllm=engine_batches(WEBLLM_BATCHES), wllama=engine_batches(WLLAMA_BATCHES))
def test_corrupted_engine_chunks_long(webllm: list[bytes], wllama: list[bytes]) -> None:
    run(WEBLLM(webllm))
    run(WLLAMA(wllama))
