"""LMSP service edges: token, CORS, version, problem documents, idempotency (docs/lmsp.md)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import httpx
import pytest

from fixtures import lmsp_user
from napllm.providers.sse import SseParser

if TYPE_CHECKING:
    from tests.service.conftest import LmspServiceHandle

pytestmark = pytest.mark.service

PROBLEM_MEMBERS = {"type", "title", "status", "detail", "instance", "code"}


def body(service: LmspServiceHandle, text: str = "Hello!", **fields: Any) -> dict[str, Any]:
    return {"model": service.model_id, "input": [lmsp_user(text)], "temperature": 0, **fields}


def assert_problem(answer: httpx.Response, status: int, code: str) -> dict[str, Any]:
    assert answer.status_code == status, answer.text
    assert answer.headers["content-type"] == "application/problem+json"
    problem: dict[str, Any] = answer.json()
    assert set(problem) == PROBLEM_MEMBERS
    assert problem["status"] == status
    assert problem["code"] == code
    assert problem["type"] == "about:blank"
    assert isinstance(problem["title"], str) and isinstance(problem["detail"], str)
    assert "Traceback" not in answer.text and 'File "' not in answer.text
    return problem


@pytest.fixture
def client(lmsp_service: LmspServiceHandle) -> Iterator[httpx.Client]:
    with lmsp_service.client() as http:
        yield http


# -- token ----------------------------------------------------------------------


def test_missing_or_wrong_token_is_401(lmsp_service: LmspServiceHandle) -> None:
    for headers in (
        {},
        {"Authorization": "Bearer wrong"},
        {"Authorization": f"Basic {lmsp_service.token}"},
        {"Authorization": f"Bearer {lmsp_service.token}x"},
    ):
        for method, path in (("GET", "/models"), ("POST", "/responses"), ("GET", "/tasks/x")):
            answer = httpx.request(method, lmsp_service.api + path, headers=headers, json={})
            problem = assert_problem(answer, 401, "unauthorized")
            assert answer.headers["www-authenticate"] == "Bearer"
            assert lmsp_service.token not in json.dumps(problem)


def test_token_file_is_private(lmsp_service: LmspServiceHandle, tmp_path_factory: Any) -> None:
    token_files = list(tmp_path_factory.getbasetemp().glob("lmsp-service*/lmsp-token"))
    assert token_files
    for path in token_files:
        assert path.stat().st_mode & 0o777 == 0o600


# -- CORS and Private Network Access ------------------------------------------------


def test_cors_preflight_for_allowed_origin(lmsp_service: LmspServiceHandle) -> None:
    answer = httpx.options(
        lmsp_service.api + "/responses",
        headers={
            "Origin": lmsp_service.allowed_origin,
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": (
                "authorization, content-type, idempotency-key, lmsp-version, last-event-id"
            ),
            "Access-Control-Request-Private-Network": "true",
        },
    )
    assert answer.status_code == 200
    assert answer.headers["access-control-allow-origin"] == lmsp_service.allowed_origin
    assert answer.headers["access-control-allow-private-network"] == "true"
    allowed = {h.strip().lower() for h in answer.headers["access-control-allow-headers"].split(",")}
    assert {
        "authorization",
        "content-type",
        "idempotency-key",
        "lmsp-version",
        "last-event-id",
    } <= allowed


def test_cors_refuses_other_origins(lmsp_service: LmspServiceHandle) -> None:
    answer = httpx.options(
        lmsp_service.api + "/responses",
        headers={
            "Origin": "http://evil.example",
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization",
            "Access-Control-Request-Private-Network": "true",
        },
    )
    # Refused: without Access-Control-Allow-Origin the browser blocks the call.
    assert answer.status_code == 400
    assert "access-control-allow-origin" not in answer.headers
    assert "access-control-allow-private-network" not in answer.headers

    simple = httpx.get(
        lmsp_service.api + "/models",
        headers={**lmsp_service.headers(), "Origin": "http://evil.example"},
    )
    assert "access-control-allow-origin" not in simple.headers
    allowed = httpx.get(
        lmsp_service.api + "/models",
        headers={**lmsp_service.headers(), "Origin": lmsp_service.allowed_origin},
    )
    assert allowed.headers["access-control-allow-origin"] == lmsp_service.allowed_origin


# -- version ----------------------------------------------------------------------------


def test_lmsp_version_header(lmsp_service: LmspServiceHandle, client: httpx.Client) -> None:
    assert client.get("/models", headers={"LMSP-Version": "1.3"}).status_code == 200
    for version in ("2.0", "0.9", "one"):
        answer = client.get("/models", headers={"LMSP-Version": version})
        assert_problem(answer, 400, "unsupported_version")
        assert answer.headers["lmsp-version"] == "1.0"


# -- bad input ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "raw",
    [
        b"{not json",
        b"[]",
        b'"text"',
        b"",
        b"\xff\xfe",
        b"[" * 100_000,
    ],
)
def test_bad_json_is_invalid_request(client: httpx.Client, raw: bytes) -> None:
    answer = client.post("/responses", content=raw, headers={"Content-Type": "application/json"})
    assert_problem(answer, 400, "invalid_request")


@pytest.mark.parametrize(
    ("change", "where"),
    [
        ({"stream": "yes"}, "stream"),
        ({"temperature": "hot"}, "temperature"),
        ({"max_output_tokens": 1.5}, "max_output_tokens"),
        ({"unknown_field": 1}, "unknown_field"),
        ({"input": "Hello"}, "input"),
        ({"input": [{"type": "message", "role": "robot", "content": []}]}, "input"),
        ({"input": [{"type": "telepathy"}]}, "input"),
        ({"tools": [{"type": "function", "name": "x"}]}, "tools"),
        ({"tool_choice": "sometimes"}, "tool_choice"),
        ({"response_format": {"type": "xml"}}, "response_format"),
        ({"model": None}, "model"),
    ],
)
def test_wrong_types_and_unknown_fields(
    lmsp_service: LmspServiceHandle, client: httpx.Client, change: dict[str, Any], where: str
) -> None:
    answer = client.post("/responses", json={**body(lmsp_service), **change})
    problem = assert_problem(answer, 400, "invalid_request")
    assert where in problem["detail"]


@pytest.mark.parametrize(
    "change",
    [
        {"max_output_tokens": 0},
        {"temperature": 3},
        {"input": []},
        {"tool_choice": "required"},
        {"extensions": {"teleport": True}},
        {"extensions": {"min_output_tokens": -1}},
        {
            "tools": [
                {"type": "function", "name": "a", "parameters": {"type": "object"}},
                {"type": "function", "name": "a", "parameters": {"type": "object"}},
            ]
        },
        {"tools": [{"type": "function", "name": "bad name!", "parameters": {"type": "object"}}]},
        {"tools": [{"type": "function", "name": "t", "parameters": {"type": 12}}]},
        {
            "tools": [{"type": "function", "name": "t", "parameters": {"type": "object"}}],
            "tool_choice": {"type": "function", "name": "other"},
        },
        {
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "x", "schema": {"type": "nonsense"}},
            }
        },
        {"response_format": {"type": "json_schema"}},
    ],
)
def test_semantically_invalid_requests(
    lmsp_service: LmspServiceHandle, client: httpx.Client, change: dict[str, Any]
) -> None:
    assert_problem(
        client.post("/responses", json={**body(lmsp_service), **change}), 400, "invalid_request"
    )


def test_orphan_function_call_output(lmsp_service: LmspServiceHandle, client: httpx.Client) -> None:
    payload = body(lmsp_service)
    payload["input"].append({"type": "function_call_output", "call_id": "call_x", "output": "{}"})
    assert_problem(client.post("/responses", json=payload), 400, "invalid_request")


def test_unknown_model(lmsp_service: LmspServiceHandle, client: httpx.Client) -> None:
    answer = client.post("/responses", json={**body(lmsp_service), "model": "gpt-9"})
    problem = assert_problem(answer, 404, "model_not_found")
    assert "gpt-9" not in problem["detail"]


def test_oversized_body(lmsp_service: LmspServiceHandle, client: httpx.Client) -> None:
    big = body(lmsp_service, "x" * (lmsp_service.max_body_bytes + 10))
    assert_problem(client.post("/responses", json=big), 413, "payload_too_large")

    def chunks() -> Iterator[bytes]:  # no Content-Length: chunked upload
        raw = json.dumps(big).encode()
        for start in range(0, len(raw), 65536):
            yield raw[start : start + 65536]

    answer = client.post(
        "/responses", content=chunks(), headers={"Content-Type": "application/json"}
    )
    assert_problem(answer, 413, "payload_too_large")


def test_wrong_media_type(lmsp_service: LmspServiceHandle, client: httpx.Client) -> None:
    answer = client.post(
        "/responses",
        content=json.dumps(body(lmsp_service)),
        headers={"Content-Type": "text/plain"},
    )
    assert_problem(answer, 415, "unsupported_media_type")


def test_unknown_route_and_method(client: httpx.Client) -> None:
    assert_problem(client.get("/nothing"), 404, "not_found")
    assert_problem(client.get("/responses"), 405, "method_not_allowed")


def test_the_service_survives_bad_input(
    lmsp_service: LmspServiceHandle, client: httpx.Client
) -> None:
    answer = client.post("/responses", json=body(lmsp_service))
    assert answer.status_code == 200
    assert answer.json()["status"] == "completed"


# -- idempotency -------------------------------------------------------------------------------


def test_same_key_same_body_replays_sync_result(
    lmsp_service: LmspServiceHandle, client: httpx.Client
) -> None:
    headers = {"Idempotency-Key": "sync-key-1"}
    first = client.post("/responses", json=body(lmsp_service), headers=headers)
    second = client.post("/responses", json=body(lmsp_service), headers=headers)
    assert first.status_code == second.status_code == 200
    # One generation: the same response, id included.
    assert second.json() == first.json()
    other = client.post("/responses", json=body(lmsp_service), headers={"Idempotency-Key": "k2"})
    assert other.json()["id"] != first.json()["id"]


def test_same_key_replays_stream_events(
    lmsp_service: LmspServiceHandle, client: httpx.Client
) -> None:
    headers = {"Idempotency-Key": "stream-key-1"}
    payload = body(lmsp_service, stream=True)

    def events() -> list[tuple[str, str, str]]:
        with client.stream("POST", "/responses", json=payload, headers=headers) as answer:
            assert answer.status_code == 200
            parser = SseParser()
            out = []
            for chunk in answer.iter_bytes():
                out.extend(parser.feed(chunk))
        return [(e.id, e.event, e.data) for e in out]

    first = events()
    assert first[-1][1] == "response.completed"
    assert events() == first


def test_same_key_different_body_is_422(
    lmsp_service: LmspServiceHandle, client: httpx.Client
) -> None:
    headers = {"Idempotency-Key": "conflict-key-1"}
    assert client.post("/responses", json=body(lmsp_service), headers=headers).status_code == 200
    answer = client.post("/responses", json=body(lmsp_service, "Who are you?"), headers=headers)
    assert_problem(answer, 422, "idempotency_conflict")


def test_same_key_while_running_is_409(
    lmsp_service: LmspServiceHandle, client: httpx.Client
) -> None:
    headers = {"Idempotency-Key": "busy-key-1"}
    limit = 4000
    payload = body(
        lmsp_service,
        stream=True,
        max_output_tokens=limit,
        extensions={"min_output_tokens": limit},
    )
    started = threading.Event()
    release = threading.Event()

    def first_request() -> None:
        with (
            lmsp_service.client() as other,
            other.stream("POST", "/responses", json=payload, headers=headers) as answer,
        ):
            for _chunk in answer.iter_bytes():
                started.set()
                release.wait(30)
                break

    worker = threading.Thread(target=first_request)
    worker.start()
    try:
        assert started.wait(30)
        answer = client.post("/responses", json=payload, headers=headers)
        assert_problem(answer, 409, "idempotency_in_progress")
    finally:
        release.set()
        worker.join()


def test_malformed_idempotency_key(lmsp_service: LmspServiceHandle, client: httpx.Client) -> None:
    answer = client.post(
        "/responses", json=body(lmsp_service), headers={"Idempotency-Key": "x" * 300}
    )
    assert_problem(answer, 400, "invalid_request")
