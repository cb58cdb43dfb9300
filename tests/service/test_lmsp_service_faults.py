"""Failures inside the LMSP service: engine errors and bugs become problems, never tracebacks."""

from __future__ import annotations

import json
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, cast

import pytest

pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed")

import httpx

from napllm.lmsp_service.app import build_app
from napllm.lmsp_service.engine import FastPath, GenerationEnd, GenerationJob, TextPiece
from napllm.lmsp_service.prompt import ChatTemplate
from napllm.lmsp_service.service import LmspService, ServiceConfig

SECRET = "internal detail /srv/model.gguf"
ORIGIN = "http://allowed.example"


class FaultyEngine:
    """An engine double: `tokenize` raises on the prompt "bug", generation fails midway."""

    model_id = "faulty"
    n_ctx = 256
    max_prompt_bytes = n_ctx * 4  # one token per character of up to 4 bytes
    template = ChatTemplate("{{ messages[-1]['content'] }}", "", "")
    supports_tools = False
    fast_path = FastPath(setting="auto", enabled=True, reason=None, cpu="")

    def __init__(self) -> None:
        self.tokenized = 0

    def tokenize(self, prompt: str) -> list[int]:
        if prompt == "bug":
            raise RuntimeError(SECRET)
        self.tokenized += 1
        return list(range(len(prompt)))

    def submit(self, job: GenerationJob, sink: Callable[[Any], None]) -> Future[None]:
        sink(TextPiece("partial "))
        sink(GenerationEnd("error", 1))
        future: Future[None] = Future()
        future.set_exception(RuntimeError(SECRET))
        return future


class SlowEngine(FaultyEngine):
    """An engine double whose generation runs into the worker's time limit."""

    def submit(self, job: GenerationJob, sink: Callable[[Any], None]) -> Future[None]:
        sink(TextPiece("partial "))
        sink(GenerationEnd("time", 1))
        future: Future[None] = Future()
        future.set_result(None)
        return future


def request(text: str, **fields: Any) -> dict[str, Any]:
    message = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}
    return {"model": "faulty", "input": [message], **fields}


@pytest.fixture
async def client() -> Any:
    service = LmspService(cast(Any, FaultyEngine()), ServiceConfig(allow_origins=[ORIGIN]))
    app = build_app(service, "tok")
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(
        transport=transport,
        base_url="http://127.0.0.1/lmsp/v1",
        headers={"Authorization": "Bearer tok"},
    ) as http:
        yield http


async def test_a_bug_is_a_generic_500_problem(client: httpx.AsyncClient) -> None:
    answer = await client.post("/responses", json=request("bug"))
    assert answer.status_code == 500
    assert answer.headers["content-type"] == "application/problem+json"
    assert answer.json()["code"] == "internal_error"
    assert SECRET not in answer.text and "Traceback" not in answer.text


async def test_engine_failure_fails_the_sync_response(client: httpx.AsyncClient) -> None:
    answer = await client.post("/responses", json=request("hi"))
    assert answer.status_code == 500
    assert answer.json()["code"] == "generation_failed"
    assert SECRET not in answer.text


async def test_engine_failure_in_a_stream_is_response_failed(client: httpx.AsyncClient) -> None:
    answer = await client.post("/responses", json=request("hi", stream=True, store=True))
    assert answer.status_code == 200
    blocks = [b for b in answer.text.replace("\r\n", "\n").split("\n\n") if b.strip()]
    last = dict(line.split(": ", 1) for line in blocks[-1].splitlines() if ": " in line)
    assert last["event"] == "response.failed"
    data = json.loads(last["data"])
    assert data["status"] == "failed" and data["error"]["code"] == "generation_failed"
    stored = (await client.get(f"/responses/{data['response_id']}")).json()
    assert stored["status"] == "failed"
    assert stored["output"][0]["content"][0]["text"] == "partial "
    assert SECRET not in answer.text


async def test_a_500_carries_the_cors_and_version_headers(client: httpx.AsyncClient) -> None:
    answer = await client.post("/responses", json=request("bug"), headers={"Origin": ORIGIN})
    assert answer.status_code == 500
    assert answer.json()["code"] == "internal_error"
    assert answer.headers["access-control-allow-origin"] == ORIGIN
    assert "lmsp-version" in answer.headers["access-control-expose-headers"].lower()
    assert answer.headers["lmsp-version"] == "1.0"


async def test_a_500_for_another_origin_has_no_cors_grant(client: httpx.AsyncClient) -> None:
    answer = await client.post(
        "/responses", json=request("bug"), headers={"Origin": "http://evil.example"}
    )
    assert answer.status_code == 500
    assert "access-control-allow-origin" not in answer.headers


async def test_the_time_limit_makes_an_incomplete_response_with_its_output() -> None:
    service = LmspService(cast(Any, SlowEngine()), ServiceConfig())
    transport = httpx.ASGITransport(app=build_app(service, "tok"))
    async with httpx.AsyncClient(
        transport=transport,
        base_url="http://127.0.0.1/lmsp/v1",
        headers={"Authorization": "Bearer tok"},
    ) as http:
        answer = await http.post("/responses", json=request("hi"))
    assert answer.status_code == 200
    body = answer.json()
    assert body["status"] == "incomplete"
    assert body["incomplete_details"] == {"reason": "max_generation_time"}
    assert body["output"][0]["content"][0]["text"] == "partial "
    assert body["usage"]["output_tokens"] == 1


class StrangeEndEngine(FaultyEngine):
    """An engine double whose worker ends with a finish reason the service does not know."""

    def submit(self, job: GenerationJob, sink: Callable[[Any], None]) -> Future[None]:
        sink(TextPiece("partial "))
        sink(cast(Any, GenerationEnd)("unheard-of", 1))
        future: Future[None] = Future()
        future.set_result(None)
        return future


async def test_an_unknown_finish_reason_fails_the_response_never_completes_it() -> None:
    """Every end is a row of `tasks.OUTCOMES`; one the table lacks is internal_error."""
    service = LmspService(cast(Any, StrangeEndEngine()), ServiceConfig())
    transport = httpx.ASGITransport(app=build_app(service, "tok"))
    async with httpx.AsyncClient(
        transport=transport,
        base_url="http://127.0.0.1/lmsp/v1",
        headers={"Authorization": "Bearer tok"},
    ) as http:
        answer = await http.post("/responses", json=request("hi"))
    assert answer.status_code == 500
    assert answer.json()["code"] == "internal_error"


def test_every_outcome_row_is_one_final_status_event_and_problem() -> None:
    from typing import get_args

    from napllm.lmsp import TERMINAL_EVENTS
    from napllm.lmsp_service.jobs import FinishReason
    from napllm.lmsp_service.problems import PROBLEM_CODES
    from napllm.lmsp_service.tasks import FINAL_STATUSES, OUTCOMES, outcome_of

    for reason in get_args(FinishReason):
        assert outcome_of(reason, cancel_requested=False) is OUTCOMES[reason]
    assert outcome_of("crashed", cancel_requested=True).status == "cancelled"
    for outcome in OUTCOMES.values():
        assert outcome.status in FINAL_STATUSES and outcome.event in TERMINAL_EVENTS
        assert (outcome.problem is not None) == (outcome.status == "failed")
        assert outcome.problem is None or outcome.problem in PROBLEM_CODES
        assert (outcome.incomplete_reason is not None) == (outcome.status == "incomplete")


async def test_a_prompt_that_cannot_fit_is_refused_without_tokenizing() -> None:
    engine = FaultyEngine()
    transport = httpx.ASGITransport(
        app=build_app(LmspService(cast(Any, engine), ServiceConfig()), "tok")
    )
    async with httpx.AsyncClient(
        transport=transport,
        base_url="http://127.0.0.1/lmsp/v1",
        headers={"Authorization": "Bearer tok"},
    ) as http:
        # More UTF-8 bytes than n_ctx tokens can cover: llama.cpp would spend
        # about a minute tokenizing 8 MiB of it before the context check.
        answer = await http.post(
            "/responses", json=request("é" * (engine.max_prompt_bytes // 2 + 1))
        )
        assert answer.status_code == 400
        assert answer.json()["code"] == "context_length_exceeded"
        assert engine.tokenized == 0
        fits = await http.post("/responses", json=request("é" * (engine.max_prompt_bytes // 2)))
        assert fits.json()["code"] == "context_length_exceeded"  # tokenized, then too long
        assert engine.tokenized == 1


class LoopingTemplateEngine(FaultyEngine):
    """An engine double whose chat template loops for hours (10^10 iterations)."""

    template = ChatTemplate(
        "{% for i in range(100000) %}{% for j in range(100000) %}x{% endfor %}{% endfor %}",
        "",
        "",
    )


async def test_a_template_that_runs_long_is_stopped_at_its_limit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("napllm.lmsp_service.service.RENDER_TIME_LIMIT_S", 1.0)
    service = LmspService(cast(Any, LoopingTemplateEngine()), ServiceConfig())
    transport = httpx.ASGITransport(app=build_app(service, "tok"))
    try:
        async with httpx.AsyncClient(
            transport=transport,
            base_url="http://127.0.0.1/lmsp/v1",
            headers={"Authorization": "Bearer tok"},
            timeout=30,
        ) as http:
            answer = await http.post("/responses", json=request("hi"))
        assert answer.status_code == 400
        assert answer.json()["code"] == "invalid_request"
        assert service.schema_pool.killed == 1  # the render ran in a child, killed at its limit
    finally:
        await service.close()
