"""Tasks of the LMSP service: events, resume, retention, cancellation (6.4; docs/lmsp.md)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import httpx
import pytest

from fixtures import lmsp_user
from napllm.providers.sse import SseParser

if TYPE_CHECKING:
    from tests.service.conftest import LmspServiceHandle

pytestmark = pytest.mark.service


def task_body(service: LmspServiceHandle, text: str = "Hello!", **fields: Any) -> dict[str, Any]:
    return {"model": service.model_id, "input": [lmsp_user(text)], "temperature": 0, **fields}


def read_events(
    client: httpx.Client, path: str, headers: dict[str, str] | None = None
) -> list[tuple[int, str, dict[str, Any]]]:
    with client.stream("GET", path, headers=headers or {}) as answer:
        assert answer.status_code == 200, answer.read()
        parser = SseParser()
        events = []
        for chunk in answer.iter_bytes():
            events.extend(parser.feed(chunk))
        events.extend(parser.close())
    return [(int(e.id), e.event, json.loads(e.data)) for e in events]


def wait_final(client: httpx.Client, task_id: str, timeout_s: float = 30) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while True:
        task: dict[str, Any] = client.get(f"/tasks/{task_id}").json()
        if task["status"] not in ("queued", "in_progress") or time.monotonic() > deadline:
            return task
        time.sleep(0.02)


@pytest.fixture
def client(lmsp_service: LmspServiceHandle) -> Iterator[httpx.Client]:
    with lmsp_service.client() as http:
        yield http


def create(client: httpx.Client, payload: dict[str, Any], key: str | None = None) -> dict[str, Any]:
    headers = {"Idempotency-Key": key} if key else {}
    answer = client.post("/tasks", json=payload, headers=headers)
    assert answer.status_code == 202, answer.text
    task: dict[str, Any] = answer.json()
    assert answer.headers["location"] == f"/lmsp/v1/tasks/{task['id']}"
    return task


def test_task_runs_and_its_events_stream_from_1(
    lmsp_service: LmspServiceHandle, client: httpx.Client
) -> None:
    task = create(client, task_body(lmsp_service))
    assert task["object"] == "task"
    assert task["id"].startswith("task_")
    assert task["status"] in ("queued", "in_progress", "completed")
    events = read_events(client, f"/tasks/{task['id']}/events")
    assert [event_id for event_id, _, _ in events] == list(range(1, len(events) + 1))
    assert events[0][1] == "response.created"
    assert events[-1][1] == "response.completed"
    assert all(data["response_id"] == task["response_id"] for _, _, data in events)
    text = "".join(d["delta"] for _, name, d in events if name == "response.output_text.delta")
    assert text == "Hello! How can I help you today?"
    final = wait_final(client, task["id"])
    assert final["status"] == "completed"
    assert final["response"]["id"] == task["response_id"]
    assert final["response"]["output"][0]["content"][0]["text"] == text


def test_resume_with_last_event_id_and_after(
    lmsp_service: LmspServiceHandle, client: httpx.Client
) -> None:
    task = create(client, task_body(lmsp_service))
    everything = read_events(client, f"/tasks/{task['id']}/events")
    assert len(everything) > 5
    path = f"/tasks/{task['id']}/events"

    resumed = read_events(client, path, headers={"Last-Event-ID": "2"})
    assert resumed == everything[2:]

    by_query = read_events(client, path + "?after=3")
    assert by_query == everything[3:]

    # Both present: `after` wins (6.4).
    both = read_events(client, path + "?after=4", headers={"Last-Event-ID": "1"})
    assert both == everything[4:]

    last = everything[-1][0]
    assert read_events(client, path + f"?after={last}") == []


def test_bad_resume_points_are_invalid_requests(
    lmsp_service: LmspServiceHandle, client: httpx.Client
) -> None:
    task = create(client, task_body(lmsp_service))
    wait_final(client, task["id"])
    for suffix in ("?after=abc", "?after=-1", "?after=999999"):
        answer = client.get(f"/tasks/{task['id']}/events{suffix}")
        assert answer.status_code == 400
        assert answer.json()["code"] == "invalid_request"


def test_events_expire_with_410_and_task_keeps_result(
    lmsp_service: LmspServiceHandle, client: httpx.Client
) -> None:
    task = create(client, task_body(lmsp_service))
    final = wait_final(client, task["id"])
    assert final["status"] == "completed"
    time.sleep(lmsp_service.retention_s + 0.5)
    for headers, suffix in (({}, ""), ({"Last-Event-ID": "1"}, ""), ({}, "?after=2")):
        answer = client.get(f"/tasks/{task['id']}/events{suffix}", headers=headers)
        assert answer.status_code == 410
        assert answer.headers["content-type"] == "application/problem+json"
        problem = answer.json()
        assert problem["code"] == "event_history_expired"
        assert problem["status"] == 410
    again = client.get(f"/tasks/{task['id']}")
    assert again.status_code == 200
    assert again.json() == final
    text = final["response"]["output"][0]["content"][0]["text"]
    assert text == "Hello! How can I help you today?"


def test_cancel_a_running_task(lmsp_service: LmspServiceHandle, client: httpx.Client) -> None:
    limit = 4000
    task = create(
        client,
        task_body(lmsp_service, max_output_tokens=limit, extensions={"min_output_tokens": limit}),
    )
    # Wait until generation produced something, then cancel.
    with client.stream("GET", f"/tasks/{task['id']}/events") as answer:
        parser = SseParser()
        for chunk in answer.iter_bytes():
            if any(e.event == "response.output_text.delta" for e in parser.feed(chunk)):
                break
    cancelled = client.post(f"/tasks/{task['id']}/cancel")
    assert cancelled.status_code == 200
    body = cancelled.json()
    assert body["status"] == "cancelled"
    assert body["response"]["status"] == "cancelled"
    assert body["response"]["usage"]["output_tokens"] < limit
    events = read_events(client, f"/tasks/{task['id']}/events")
    assert events[-1][1] == "response.cancelled"
    assert events[-1][2] == {"response_id": task["response_id"], "status": "cancelled"}
    # Cancelling again changes nothing.
    assert client.post(f"/tasks/{task['id']}/cancel").json() == body


def test_reading_events_does_not_own_the_task(
    lmsp_service: LmspServiceHandle, client: httpx.Client
) -> None:
    task = create(
        client,
        task_body(lmsp_service, max_output_tokens=300, extensions={"min_output_tokens": 300}),
    )
    with client.stream("GET", f"/tasks/{task['id']}/events") as answer:
        for _chunk in answer.iter_bytes():
            break  # a reader that goes away early
    final = wait_final(client, task["id"])
    assert final["status"] == "incomplete"
    assert final["response"]["usage"]["output_tokens"] == 300


def test_unknown_task(client: httpx.Client) -> None:
    for method, path in (
        ("GET", "/tasks/task_nope"),
        ("GET", "/tasks/task_nope/events"),
        ("POST", "/tasks/task_nope/cancel"),
    ):
        answer = client.request(method, path)
        assert answer.status_code == 404
        assert answer.json()["code"] == "task_not_found"


def test_task_creation_is_idempotent(lmsp_service: LmspServiceHandle, client: httpx.Client) -> None:
    payload = task_body(lmsp_service)
    first = create(client, payload, key="task-key-1")
    second = create(client, payload, key="task-key-1")
    assert second["id"] == first["id"]
    assert second["response_id"] == first["response_id"]
    conflict = client.post(
        "/tasks",
        json=task_body(lmsp_service, "Who are you?"),
        headers={"Idempotency-Key": "task-key-1"},
    )
    assert conflict.status_code == 422
    assert conflict.json()["code"] == "idempotency_conflict"


def test_task_request_is_checked_like_a_response_request(
    lmsp_service: LmspServiceHandle, client: httpx.Client
) -> None:
    answer = client.post("/tasks", json={**task_body(lmsp_service), "model": "nope"})
    assert answer.status_code == 404
    assert answer.json()["code"] == "model_not_found"
