"""Test data shared by the unit, service and browser suites (one definition each).

`user` is a NAP-LLM user message with one text part, `lmsp_user` the same
as an LMSP 1.0 message input item. `WEATHER_TOOL` is a NAP-LLM Tool record (what a napplet sends);
`WEATHER_FUNCTION` is the same tool as an LMSP 1.0 function tool (6.5), as
the translation sends it to a provider. `lmsp_request` builds an LMSP
request with one user message; `Body` is a scripted HTTP response body for
the providers' HTTP tests; `done_items` and `text_of` read LMSP events.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import httpx

from napllm.lmsp import LmspEvent, LmspRequest

WEATHER_TOOL: dict[str, Any] = {
    "name": "get_weather",
    "description": "Get the current weather for a city.",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}

WEATHER_FUNCTION: dict[str, Any] = {"type": "function", **WEATHER_TOOL}


def user(text: str) -> dict[str, Any]:
    """A NAP-LLM user message with one text part."""
    return {"role": "user", "content": [{"type": "text", "text": text}]}


def lmsp_user(text: str) -> dict[str, Any]:
    """An LMSP 1.0 user message input item with one `input_text` part."""
    return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}


def lmsp_request(model: str = "m", **fields: Any) -> LmspRequest:
    """An LMSP request for `model` with one user message "Hi"; `fields` override."""
    body: dict[str, Any] = {"model": model, "input": [lmsp_user("Hi")]}
    body.update(fields)
    return LmspRequest.model_validate(body, strict=False)


class Body(httpx.AsyncByteStream):
    """A response body: `chunks` (yielding to the loop after each), then a drop, a hang or the end.

    `drop_error` is what a dropped connection raises (a transport error).
    """

    drop_error: type[Exception] = httpx.ReadError

    def __init__(self, *chunks: bytes, drop: bool = False, hang: bool = False) -> None:
        self.chunks = chunks
        self.drop = drop
        self.hang = hang
        self.closed = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for chunk in self.chunks:
            yield chunk
            await asyncio.sleep(0)
        if self.drop:
            raise self.drop_error("connection reset")
        if self.hang:
            await asyncio.Event().wait()

    async def aclose(self) -> None:
        self.closed = True


def done_items(events: list[LmspEvent]) -> list[dict[str, Any]]:
    """The items of every `response.output_item.done` event, in order."""
    return [e.data["item"] for e in events if e.event == "response.output_item.done"]


def text_of(events: list[LmspEvent]) -> str:
    """The output text of every completed message item, joined."""
    return "".join(
        part["text"]
        for item in done_items(events)
        if item["type"] == "message"
        for part in item["content"]
        if part["type"] == "output_text"
    )
