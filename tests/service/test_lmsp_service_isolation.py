"""The LMSP service survives hostile schemas and a crashing model (docs/lmsp.md)."""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from tests.service.conftest import LmspServiceHandle, start_lmsp_service

from fixtures import lmsp_user
from napllm.lmsp_service.grammar import (
    MAX_GRAMMAR_NESTING,
    MAX_REPETITION,
    GrammarUnavailable,
    grammar_nesting,
    json_grammar,
    pattern_is_unambiguous,
)
from napllm.providers.sse import SseParser

pytestmark = pytest.mark.service


def body(service: LmspServiceHandle, text: str, **fields: Any) -> dict[str, Any]:
    return {"model": service.model_id, "input": [lmsp_user(text)], "temperature": 0, **fields}


def tool(parameters: dict[str, Any]) -> dict[str, Any]:
    return {"type": "function", "name": "f", "parameters": parameters}


@pytest.fixture
def client(lmsp_service: LmspServiceHandle) -> Iterator[httpx.Client]:
    with lmsp_service.client(timeout_s=60) as http:
        yield http


def worker_pids(service_pid: int) -> list[int]:
    """Process ids of the service's model workers: its children that map the GGUF file.

    The service has other spawned children (the schema workers of
    `bounded.py`, the resource tracker); only a model worker maps the model.
    """
    children = Path(f"/proc/{service_pid}/task/{service_pid}/children").read_text().split()
    pids = []
    for pid in children:
        try:
            maps = Path(f"/proc/{pid}/maps").read_bytes()
        except OSError:  # ended meanwhile
            continue
        if b".gguf" in maps:
            pids.append(int(pid))
    return pids


def assert_served(service: LmspServiceHandle, client: httpx.Client) -> None:
    answer = client.post("/responses", json=body(service, "Hello!", max_output_tokens=8))
    assert answer.status_code == 200
    assert answer.json()["status"] in {"completed", "incomplete"}
    assert answer.json()["output"][0]["type"] == "message"


# -- hostile schemas -------------------------------------------------------------------------


def test_the_crashing_tool_schema_is_refused_and_the_service_stays_up(
    lmsp_service: LmspServiceHandle, client: httpx.Client
) -> None:
    # The 330-byte request on which llama.cpp's GBNF parser overflowed its stack.
    payload = body(
        lmsp_service,
        "hi",
        tools=[
            tool({"type": "object", "properties": {"s": {"type": "string", "maxLength": 2000}}})
        ],
        tool_choice="required",
    )
    answer = client.post("/responses", json=payload)
    assert answer.status_code == 400
    assert answer.headers["content-type"] == "application/problem+json"
    assert answer.json()["code"] == "unsupported_capability"
    assert lmsp_service.process.poll() is None
    assert_served(lmsp_service, client)


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "string", "pattern": "^a{100000}$"},
        {"type": "string", "pattern": "^(ab){1,99999}$"},
        {"type": "array", "items": {"type": "integer"}, "minItems": 5000},
        {"type": "object", "properties": {"x": {"type": "string", "minLength": 3000}}},
    ],
)
def test_oversized_repetitions_are_unsupported_before_generation(
    lmsp_service: LmspServiceHandle, client: httpx.Client, schema: dict[str, Any]
) -> None:
    fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
    answer = client.post("/responses", json=body(lmsp_service, "hi", response_format=fmt))
    assert answer.status_code == 400
    assert answer.json()["code"] == "unsupported_capability"
    assert lmsp_service.process.poll() is None


def test_a_pattern_python_cannot_compile_is_an_invalid_schema(
    lmsp_service: LmspServiceHandle, client: httpx.Client
) -> None:
    schema = {"type": "string", "pattern": "^(ab){1,99999999999999999999}$"}
    fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
    answer = client.post("/responses", json=body(lmsp_service, "hi", response_format=fmt))
    assert answer.status_code == 400
    assert answer.json()["code"] == "invalid_request"


def test_schemas_within_the_limits_still_build() -> None:
    gbnf = json_grammar(
        {
            "type": "object",
            "properties": {
                "email": {"type": "string", "pattern": "^[a-z]{1,64}@[a-z]{1,64}$"},
                "note": {"type": "string", "maxLength": MAX_REPETITION},
                "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 20},
            },
        }
    )
    assert "root ::=" in gbnf
    assert grammar_nesting(gbnf) <= MAX_GRAMMAR_NESTING
    with pytest.raises(GrammarUnavailable):
        json_grammar({"type": "string", "maxLength": MAX_REPETITION + 1})


@pytest.mark.parametrize(
    ("pattern", "unambiguous"),
    [
        ("^(a?){500}$", False),
        ("^(a|b)*$", False),
        ("(a+)+", False),
        ("(?:x|y){2}", False),
        ("(a)\\1", False),
        ("(a", False),
        ("[a", False),
        ("(ab+)?", True),
        ("^[a-z]{0,500}$", True),
        ("^(\\d{3}-)?\\d{4}$", True),
        ("^[(|)]+$", True),
        ("(ab){3}", True),
        ("(a*){1}", True),
    ],
)
def test_a_pattern_that_repeats_an_ambiguous_group_is_refused(
    pattern: str, unambiguous: bool
) -> None:
    assert pattern_is_unambiguous(pattern) is unambiguous
    if not unambiguous:
        with pytest.raises(GrammarUnavailable):
            json_grammar({"type": "string", "pattern": pattern})


def test_grammar_nesting_skips_literals_and_classes() -> None:
    assert grammar_nesting('root ::= "((((" [(((] ( "a" ( "b" ) )') == 2


# -- a crash inside llama.cpp --------------------------------------------------------------


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="finds the worker through /proc")
def test_a_worker_crash_fails_only_its_generation_and_the_model_is_reloaded(
    tmp_path: Path,
) -> None:
    # One slot, so that the second generation waits (with more slots it would
    # join the batch and share its fate: tests/service/test_lmsp_batching.py).
    service = start_lmsp_service(tmp_path, "--slots", "1")
    try:
        with service.client(timeout_s=60) as client:
            crash_one_of_two(service, client)
    finally:
        service.process.terminate()
        service.process.wait(timeout=30)


def crash_one_of_two(lmsp_service: LmspServiceHandle, client: httpx.Client) -> None:
    [worker] = worker_pids(lmsp_service.process.pid)
    limit = 3000
    long_job = body(
        lmsp_service,
        "Hello!",
        stream=True,
        max_output_tokens=limit,
        extensions={"min_output_tokens": limit},
    )
    parser = SseParser()
    events: list[tuple[str, dict[str, Any]]] = []
    killed = False
    with client.stream("POST", "/responses", json=long_job) as answer:
        assert answer.status_code == 200
        for chunk in answer.iter_bytes():
            for event in parser.feed(chunk):
                events.append((event.event, json.loads(event.data)))
                if event.event == "response.output_text.delta" and not killed:
                    # Another generation waits behind this one; it must not be lost.
                    with lmsp_service.client() as other:
                        queued = other.post(
                            "/tasks", json=body(lmsp_service, "Hi", max_output_tokens=8)
                        )
                    assert queued.status_code == 202
                    os.kill(worker, signal.SIGSEGV)  # what llama.cpp did on the hostile grammar
                    killed = True
    name, data = events[-1]
    assert name == "response.failed"
    assert data["error"]["code"] == "model_crashed"
    assert data["error"]["status"] == 500
    assert lmsp_service.process.poll() is None
    # The next request is served by a new worker with the model loaded again.
    with lmsp_service.client(timeout_s=120) as fresh:
        assert_served(lmsp_service, fresh)
        task = fresh.get(f"/tasks/{queued.json()['id']}").json()
        assert task["status"] in {"completed", "incomplete"}
    assert worker_pids(lmsp_service.process.pid) != [worker]


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="finds the worker through /proc")
def test_a_stuck_worker_is_replaced_when_its_generation_is_cancelled(tmp_path: Path) -> None:
    service = start_lmsp_service(tmp_path, "--cancel-grace-seconds", "1")
    try:
        with service.client(timeout_s=120) as client:
            [worker] = worker_pids(service.process.pid)
            limit = 3000
            task = client.post(
                "/tasks",
                json=body(
                    service,
                    "Hello!",
                    max_output_tokens=limit,
                    extensions={"min_output_tokens": limit},
                ),
            ).json()
            with client.stream("GET", f"/tasks/{task['id']}/events") as events:
                for line in events.iter_lines():
                    if line == "event: response.output_text.delta":
                        break
            # Stopped inside llama.cpp, as far as the service can tell: it
            # never reaches the next check for cancellation.
            os.kill(worker, signal.SIGSTOP)
            cancelled = client.post(f"/tasks/{task['id']}/cancel").json()
            assert cancelled["status"] == "cancelled"
            assert_served(service, client)
            assert worker_pids(service.process.pid) != [worker]
    finally:
        service.process.terminate()
        service.process.wait(timeout=30)
