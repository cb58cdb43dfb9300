"""Benchmark: the protocol side of the network providers, in-process.

Prints, for this machine:

- the SSE parser (`providers/sse.py`): MB/s and events/s over a stream of
  LMSP-shaped events fed in chunks of 16, 256, 4096 and 65536 bytes;
- the chat-completions state machine (`providers/chat_stream.py`): chunks/s
  for one-token text chunks, with and without `<tool_call>` scanning, and
  and with the text of 32 tokens in one chunk, as the in-browser engines'
  workers merge each batch (web/engines/batcher.js), the same text either way;
- the LMSP client provider (`providers/lmsp_client.py`) reading a streamed
  response through httpx's in-memory transport: events/s end to end.

Usage: python bench/bench_providers.py [--events 20000] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import AsyncIterator

import httpx

from napllm.lmsp import LmspEvent, LmspRequest
from napllm.providers.chat_stream import ChatStreamToLmsp
from napllm.providers.http_httpx import HttpxPort
from napllm.providers.lmsp_client import LmspProvider
from napllm.providers.sse import SseParser

PART = {"type": "input_text", "text": "x"}


def lmsp_stream(count: int) -> bytes:
    events = [LmspEvent(id=1, event="response.created", data={"response_id": "r", "status": "x"})]
    for n in range(2, count):
        events.append(
            LmspEvent(
                id=n,
                event="response.output_text.delta",
                data={"response_id": "r", "item_id": "msg_1", "delta": f"token {n} "},
            )
        )
    events.append(LmspEvent(id=count, event="response.completed", data={"response_id": "r"}))
    return "".join(e.to_sse() for e in events).encode()


def bench_sse(stream: bytes) -> None:
    for size in (16, 256, 4096, 65536):
        chunks = [stream[i : i + size] for i in range(0, len(stream), size)]
        parser = SseParser()
        start = time.perf_counter()
        count = 0
        for chunk in chunks:
            count += len(parser.feed(chunk))
        count += len(parser.close())
        elapsed = time.perf_counter() - start
        print(
            f"sse parser   chunk {size:>6} B: {len(stream) / elapsed / 1e6:8.2f} MB/s, "
            f"{count / elapsed:>10,.0f} events/s ({count} events)"
        )


def bench_chat(count: int) -> None:
    chunks = [{"choices": [{"index": 0, "delta": {"content": "tok "}}]} for _ in range(count)]
    chunks.append({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
    for scan in (False, True):
        state = ChatStreamToLmsp(parse_tool_call_blocks=scan)
        start = time.perf_counter()
        events = 0
        for chunk in chunks:
            events += len(state.feed(chunk))
        events += len(state.finish())
        elapsed = time.perf_counter() - start
        label = "with <tool_call> scan" if scan else "plain text          "
        print(f"chat chunks  {label}: {len(chunks) / elapsed:>10,.0f} chunks/s ({events} events)")
    texts = []
    for batch_size in (1, 32):
        # What a worker sends for `batch_size` one-token chunks: one chunk.
        merged = [
            {"choices": [{"index": 0, "delta": {"content": "tok " * min(batch_size, count - i)}}]}
            for i in range(0, count, batch_size)
        ]
        state = ChatStreamToLmsp(parse_tool_call_blocks=True)
        start = time.perf_counter()
        got = []
        for chunk in [*merged, chunks[-1]]:
            got += state.feed(chunk)
        got += state.finish()
        elapsed = time.perf_counter() - start
        texts.append(
            "".join(str(e.data.get("delta", "")) for e in got if e.event.endswith("text.delta"))
        )
        print(
            f"chat chunks  {batch_size:>2} token(s) per chunk: {count / elapsed:>10,.0f} "
            f"tokens/s ({len(got)} events)"
        )
    if texts[0] != texts[1]:
        raise SystemExit("merged batches changed the text")


async def bench_lmsp_client(stream: bytes, count: int) -> None:
    class Body(httpx.AsyncByteStream):
        async def __aiter__(self) -> AsyncIterator[bytes]:
            for i in range(0, len(stream), 4096):
                yield stream[i : i + 4096]

    async def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, stream=Body())

    request = LmspRequest.model_validate(
        {
            "model": "m",
            "stream": True,
            "input": [{"type": "message", "role": "user", "content": [PART]}],
        },
        strict=False,
    )
    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
        provider = LmspProvider(HttpxPort(client), "http://127.0.0.1:9", "token")
        start = time.perf_counter()
        got = [e async for e in provider.respond(request)]
        elapsed = time.perf_counter() - start
    assert len(got) == count
    print(f"lmsp client  streamed response: {count / elapsed:>10,.0f} events/s ({count} events)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=20000)
    parser.add_argument("--quick", action="store_true", help="a short run (500 events)")
    args = parser.parse_args()
    if args.quick:
        args.events = 500
    stream = lmsp_stream(args.events)
    bench_sse(stream)
    bench_chat(args.events)
    asyncio.run(bench_lmsp_client(stream, args.events))


if __name__ == "__main__":
    main()
