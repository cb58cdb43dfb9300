"""The OpenAI-compatible provider against llama-cpp-python's server running TinyChat.

The fixture of this module starts `llama_cpp.server --model
models/tinychat/tiny-chat-q8_0.gguf --host 127.0.0.1 --port <free>` (through
`llama_server_safe.py`: llama.cpp's CPU fast path off, so it answers on every
CPU) and stops it at the end of the module. That server only knows `json_object` (with a
`schema` member) for structured output, and returns TinyChat's Hermes-style
`<tool_call>` block as plain content, which the provider parses.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from fixtures import WEATHER_FUNCTION, done_items, lmsp_user, text_of
from napllm.errors import ErrorCode, ProviderFailure
from napllm.lmsp import LmspEvent, LmspRequest
from napllm.providers.http_httpx import HttpxPort
from napllm.providers.openai_compat import OpenAICompatProvider, discover_models

pytestmark = pytest.mark.service

REPO = Path(__file__).resolve().parents[2]
MODEL = REPO / "models" / "tinychat" / "tiny-chat-q8_0.gguf"
PERSON_SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
    "required": ["name", "age"],
}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="module")
def llama_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Base URL of a running `llama_cpp.server` with TinyChat."""
    if importlib.util.find_spec("llama_cpp") is None:
        pytest.skip("llama-cpp-python is not installed (pip install 'llama-cpp-python[server]')")
    if importlib.util.find_spec("llama_cpp.server") is None:
        pytest.skip("llama-cpp-python's server extra is not installed")
    if not MODEL.is_file():
        pytest.fail(f"TinyChat model missing at {MODEL.relative_to(REPO)}")
    port = _free_port()
    log_path = tmp_path_factory.mktemp("llama-server") / "server.log"
    log = log_path.open("wb")
    process = subprocess.Popen(
        [
            sys.executable,
            str(Path(__file__).with_name("llama_server_safe.py")),
            "--model",
            str(MODEL.relative_to(REPO)),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=REPO,
    )
    base_url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            if process.poll() is not None:
                raise RuntimeError(
                    "llama_cpp.server exited early:\n" + log_path.read_text(errors="replace")
                )
            try:
                if httpx.get(base_url + "/v1/models", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("llama_cpp.server did not become ready within 60 s")
            time.sleep(0.1)
        yield base_url
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()


async def model_id(base_url: str) -> str:
    async with httpx.AsyncClient() as client:
        (model,) = await discover_models(HttpxPort(client), base_url, None)
    return model


async def respond(base_url: str, body: dict[str, Any], **options: Any) -> list[LmspEvent]:
    request = LmspRequest.model_validate(
        {"model": await model_id(base_url), "temperature": 0, **body}, strict=False
    )
    async with httpx.AsyncClient() as client:
        provider = OpenAICompatProvider(HttpxPort(client), base_url, **options)

        async def collect() -> list[LmspEvent]:
            return [e async for e in provider.respond(request)]

        return await asyncio.wait_for(collect(), 60)


async def test_discovery(llama_server: str) -> None:
    assert (await model_id(llama_server)).endswith("tiny-chat-q8_0.gguf")


async def test_stream_hello(llama_server: str) -> None:
    events = await respond(llama_server, {"input": [lmsp_user("Hello!")], "stream": True})
    deltas = [e.data["delta"] for e in events if e.event == "response.output_text.delta"]
    assert len(deltas) > 1  # really streamed
    assert "".join(deltas) == text_of(events) == "Hello! How can I help you today?"
    assert events[0].event == "response.created"
    assert events[-1].event == "response.completed"


async def test_tool_call_block_becomes_a_function_call(llama_server: str) -> None:
    events = await respond(
        llama_server,
        {"input": [lmsp_user("What is the weather in Berlin?")], "tools": [WEATHER_FUNCTION]},
    )
    assert not any(e.event == "response.output_text.delta" for e in events)
    (call,) = done_items(events)
    assert call["type"] == "function_call"
    assert call["name"] == "get_weather"
    assert json.loads(call["arguments"]) == {"city": "Berlin"}
    assert call["call_id"].startswith("call_")
    assert events[-1].event == "response.completed"


async def test_tool_result_round_trip(llama_server: str) -> None:
    result = json.dumps({"city": "Paris", "temperature": 21, "condition": "sunny"})
    events = await respond(
        llama_server,
        {
            "input": [
                lmsp_user("What is the weather in Paris?"),
                {
                    "type": "function_call",
                    "call_id": "call_1",
                    "name": "get_weather",
                    "arguments": '{"city": "Paris"}',
                },
                {"type": "function_call_output", "call_id": "call_1", "output": result},
            ],
            "tools": [WEATHER_FUNCTION],
        },
    )
    assert text_of(events) == "It is sunny in Paris with a temperature of 21 degrees."


async def test_json_via_response_format(llama_server: str) -> None:
    events = await respond(
        llama_server,
        {
            "input": [lmsp_user("Return a JSON object with name Alice and age 30.")],
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "person", "schema": PERSON_SCHEMA},
            },
        },
        response_format_style="json_object_schema",
    )
    assert json.loads(text_of(events)) == {"name": "Alice", "age": 30}


async def test_max_tokens_gives_incomplete(llama_server: str) -> None:
    events = await respond(llama_server, {"input": [lmsp_user("Hello!")], "max_output_tokens": 3})
    assert events[-1].event == "response.incomplete"
    assert events[-1].data["incomplete_details"] == {"reason": "max_output_tokens"}


async def test_server_rejection_is_a_safe_failure(llama_server: str) -> None:
    # llama-cpp-python refuses `json_schema` with a 500 whose body holds a traceback
    with pytest.raises(ProviderFailure) as info:
        await respond(
            llama_server,
            {
                "input": [lmsp_user("Hello!")],
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "person", "schema": PERSON_SCHEMA},
                },
            },
        )
    assert info.value.code is ErrorCode.PROVIDER_ERROR
    for text in (str(info.value), info.value.detail or "", info.value.to_nap_error().message):
        assert "Traceback" not in text and "site-packages" not in text
