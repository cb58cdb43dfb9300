"""Hostile JSON Schemas never stall the LMSP service (docs/security.md, the local model service).

The reproducer: a string schema whose `pattern` (`a*` ten times, then `b`)
backtracks in Python's `re` on N = 60 `a`s (about 60**9 steps, longer
than any test run), written by an engine double that ignores the grammar
(as a grammar llama.cpp fails to parse would): the output check evaluates
it. Other clients must keep being answered (p99
under 1 s) and the hostile response must fail at the check's time limit.
A schema that takes long merely to check against the metaschema is refused
at that check's limit, just as promptly.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import Future
from typing import Any, cast

import pytest

pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed")

import httpx

from napllm.lmsp_service import service as service_module
from napllm.lmsp_service.app import build_app
from napllm.lmsp_service.engine import FastPath, GenerationEnd, GenerationJob, TextPiece
from napllm.lmsp_service.prompt import ChatTemplate
from napllm.lmsp_service.service import LmspService, ServiceConfig

N = 60
#: (No length keywords beside the pattern: the grammar would drop them, and
#: the service refuses such a schema before generating.)
HOSTILE_STRING = {"type": "string", "pattern": "^" + "a*" * 10 + "b$"}
CHECK_LIMIT_S = 2.0


class FixedEngine:
    """An engine double whose generation answers `text` (a model obeying the grammar)."""

    model_id = "fixed"
    n_ctx = 4096
    max_prompt_bytes = n_ctx * 16
    template = ChatTemplate("{{ messages[-1]['content'] }}", "", "")
    supports_tools = True
    fast_path = FastPath(setting="auto", enabled=True, reason=None, cpu="")

    def __init__(self, text: str) -> None:
        self.text = text

    def render(self, messages: list[dict[str, Any]], tools: object) -> str:
        return "prompt"

    def tokenize(self, prompt: str) -> list[int]:
        return [1, 2, 3]

    def submit(self, job: GenerationJob, sink: Callable[[Any], None]) -> Future[None]:
        sink(TextPiece(self.text))
        sink(GenerationEnd("stop", 10))
        future: Future[None] = Future()
        future.set_result(None)
        return future


def request(**fields: Any) -> dict[str, Any]:
    message = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "x"}]}
    return {"model": "fixed", "input": [message], **fields}


async def client_for(engine: FixedEngine) -> AsyncIterator[httpx.AsyncClient]:
    service = LmspService(cast(Any, engine), ServiceConfig())
    service.schema_pool.start()
    transport = httpx.ASGITransport(app=build_app(service, "tok"), raise_app_exceptions=False)
    try:
        async with httpx.AsyncClient(
            transport=transport,
            base_url="http://127.0.0.1/lmsp/v1",
            headers={"Authorization": "Bearer tok"},
            timeout=120,
        ) as http:
            # Warm: both workers have imported their modules.
            fmt = {
                "type": "json_schema",
                "json_schema": {"name": "w", "schema": {"type": "object"}},
            }
            await asyncio.gather(
                *(http.post("/responses", json=request(response_format=fmt)) for _ in range(2))
            )
            yield http
    finally:
        await service.close()


async def benign_latencies(http: httpx.AsyncClient, stop: asyncio.Event) -> list[float]:
    """Seconds each `GET /models` took, one after another, until `stop`."""
    latencies: list[float] = []
    while not stop.is_set():
        started = time.monotonic()
        answer = await http.get("/models")
        latencies.append(time.monotonic() - started)
        assert answer.status_code == 200
        await asyncio.sleep(0.02)
    return latencies


def p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]


async def hostile_run(http: httpx.AsyncClient, bodies: list[dict[str, Any]]) -> tuple[list, list]:
    stop = asyncio.Event()
    benign = asyncio.create_task(benign_latencies(http, stop))
    timings: list[float] = []

    async def one(body: dict[str, Any]) -> httpx.Response:
        started = time.monotonic()
        answer = await http.post("/responses", json=body)
        timings.append(time.monotonic() - started)
        return answer

    answers = await asyncio.gather(*(one(b) for b in bodies))
    stop.set()
    latencies = await benign
    return list(zip(answers, timings, strict=True)), latencies


@pytest.fixture
async def string_client(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[httpx.AsyncClient]:
    monkeypatch.setattr(service_module, "OUTPUT_CHECK_TIME_LIMIT_S", CHECK_LIMIT_S)
    async for http in client_for(FixedEngine(json.dumps("a" * N))):
        yield http


async def test_a_backtracking_output_pattern_fails_in_time_and_others_are_served(
    string_client: httpx.AsyncClient,
) -> None:
    fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": HOSTILE_STRING}}
    # Three at once against two workers: the third waits, and is bounded too.
    results, latencies = await hostile_run(
        string_client, [request(response_format=fmt) for _ in range(3)]
    )
    for answer, took in results:
        assert answer.status_code == 500, (answer.text, took)
        assert answer.json()["code"] == "model_output_invalid"
        assert answer.json()["detail"] == "The model's output could not be checked in time."
        # Its own limit, plus waiting for a child (another request's limit) and
        # that child's replacement starting up (not charged to the check).
        assert took < 3 * CHECK_LIMIT_S + 15.0, took
    assert len(latencies) >= 10
    assert p99(latencies) < 1.0, sorted(latencies)[-5:]
    # The killed workers were replaced: an ordinary check works right after.
    plain = {"type": "json_schema", "json_schema": {"name": "y", "schema": {"type": "string"}}}
    answer = await string_client.post("/responses", json=request(response_format=plain))
    assert answer.status_code == 200, answer.text
    assert answer.json()["status"] == "completed"


async def test_the_same_schema_as_forced_tool_parameters_is_bounded_too(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(service_module, "OUTPUT_CHECK_TIME_LIMIT_S", CHECK_LIMIT_S)
    call = '<tool_call>\n{"name": "t", "arguments": {"s": "' + "a" * N + '"}}\n</tool_call>'
    tool = {
        "type": "function",
        "name": "t",
        "parameters": {"type": "object", "properties": {"s": HOSTILE_STRING}, "required": ["s"]},
    }
    async for http in client_for(FixedEngine(call)):
        results, latencies = await hostile_run(
            http, [request(tools=[tool], tool_choice="required")]
        )
        ((answer, took),) = results
        assert answer.status_code == 500
        assert answer.json()["detail"] == "The model's output could not be checked in time."
        assert took < CHECK_LIMIT_S + 3.0, took
        assert p99(latencies) < 1.0


async def test_a_schema_that_is_slow_to_check_is_refused_without_stalling_others(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # 150 KB: 2,000 distinct patterns, each compiled by the metaschema check
    # (about 8 s of Python on the event loop before the check moved out).
    monkeypatch.setattr(service_module, "SCHEMA_CHECK_TIME_LIMIT_S", 1.0)
    properties = {
        f"p{i}": {"type": "string", "pattern": f"a{{{i % 400}}}b+", "not": {"enum": [i]}}
        for i in range(2000)
    }
    schema = {"type": "object", "properties": properties}
    fmt = {"type": "json_schema", "json_schema": {"name": "g", "schema": schema}}
    async for http in client_for(FixedEngine("{}")):
        results, latencies = await hostile_run(http, [request(response_format=fmt)])
        ((answer, took),) = results
        assert answer.status_code == 400, answer.text
        assert answer.json()["code"] == "unsupported_capability"
        assert took < 1.0 + 5.0, took
        assert p99(latencies) < 1.0


async def test_schemas_over_the_size_bound_never_reach_a_worker() -> None:
    """A 5 MB schema kept a schema worker busy to its limit; past 256 KiB it is refused at once."""
    properties = {f"p{i}": {"type": "string", "description": "x" * 40} for i in range(8_000)}
    schema = {"type": "object", "properties": properties}
    assert len(json.dumps(schema, separators=(",", ":"))) > service_module.MAX_SCHEMA_CHARS
    fmt = {"type": "json_schema", "json_schema": {"name": "big", "schema": schema}}
    tool = {"type": "function", "name": "f", "parameters": schema}
    async for http in client_for(FixedEngine("{}")):
        for body in (request(response_format=fmt), request(tools=[tool])):
            results, latencies = await hostile_run(http, [body])
            ((answer, took),) = results
            assert answer.status_code == 400, answer.text
            assert answer.json()["code"] == "unsupported_capability"
            assert "256 KiB" in answer.json()["detail"]
            assert took < 2.0, took
            assert p99(latencies) < 1.0


async def test_an_output_check_waits_longer_for_a_busy_pool_and_says_so() -> None:
    """A generated answer waits for a schema worker longer than a new request would."""
    from napllm.lmsp_service.bounded import PoolBusy
    from napllm.lmsp_service.validation import Checked

    seen: list[float] = []

    class BusyPool:
        async def call(self, time_limit_s: float, function: Any, *args: Any, **kw: Any) -> Any:
            seen.append(kw["queue_wait_s"])
            raise PoolBusy("no free schema worker")

    service = LmspService(cast(Any, FixedEngine("{}")), ServiceConfig())
    service.schema_pool = cast(Any, BusyPool())
    checked = Checked(
        request=cast(Any, type("R", (), {"tools": None})()),
        items=[],
        tool_names=None,
        forced_tool=False,
        output_schema={"type": "object"},
    )

    class Assembled:
        def function_calls(self) -> list[Any]:
            return []

        def message_text(self) -> str:
            return "{}"

    failure = await service._check_output(checked, cast(Any, Assembled()))
    assert seen == [service_module.OUTPUT_CHECK_QUEUE_WAIT_S]
    assert service_module.OUTPUT_CHECK_QUEUE_WAIT_S > 30.0
    assert failure == "The model's output could not be checked: the service is too busy."
