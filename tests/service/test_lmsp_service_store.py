"""Stored responses and tasks persist in SQLite across restarts, within limits (docs/lmsp.md)."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from tests.service.conftest import LmspServiceHandle, service_env, start_lmsp_service

from fixtures import lmsp_user
from napllm.lmsp_service.store import SqliteStore
from napllm.lmsp_service.tasks import ResponseRun, Task


def start(workdir: Path) -> LmspServiceHandle:
    pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed")
    return start_lmsp_service(workdir, "--retention-seconds", "600")


def stop(service: LmspServiceHandle, sig: int = signal.SIGTERM) -> None:
    service.process.send_signal(sig)
    service.process.wait(timeout=30)


def events_of(client: httpx.Client, task_id: str, after: int = 0) -> list[tuple[int, str, Any]]:
    answer = client.get(f"/tasks/{task_id}/events", params={"after": after})
    assert answer.status_code == 200
    out = []
    for block in answer.text.replace("\r\n", "\n").split("\n\n"):
        fields = dict(line.split(": ", 1) for line in block.splitlines() if ": " in line)
        if "event" in fields and "id" in fields:
            out.append((int(fields["id"]), fields["event"], json.loads(fields["data"])))
    return out


def wait_final(client: httpx.Client, task_id: str) -> dict[str, Any]:
    deadline = time.monotonic() + 60
    while True:
        task: dict[str, Any] = client.get(f"/tasks/{task_id}").json()
        if task["status"] not in {"queued", "in_progress"}:
            return task
        assert time.monotonic() < deadline
        time.sleep(0.1)


@pytest.mark.service
def test_tasks_and_stored_responses_survive_a_restart(tmp_path: Path) -> None:
    service = start(tmp_path)
    try:
        with service.client() as client:
            created = client.post(
                "/tasks",
                json={
                    "model": service.model_id,
                    "input": [lmsp_user("Hello!")],
                    "max_output_tokens": 12,
                },
            )
            assert created.status_code == 202
            task_id = created.json()["id"]
            before = wait_final(client, task_id)
            stored = client.post(
                "/responses",
                json={"model": service.model_id, "input": [lmsp_user("Hi")], "store": True},
            ).json()
    finally:
        stop(service)
    assert (tmp_path / "lmsp-store.sqlite3").stat().st_mode & 0o077 == 0

    service = start(tmp_path)
    try:
        with service.client() as client:
            after = client.get(f"/tasks/{task_id}").json()
            assert after == before
            events = events_of(client, task_id)
            assert [event_id for event_id, _, _ in events] == list(range(1, len(events) + 1))
            assert events[0][1] == "response.created"
            assert events[-1][1] in {"response.completed", "response.incomplete"}
            text = "".join(d["delta"] for _, e, d in events if e == "response.output_text.delta")
            assert text == before["response"]["output"][0]["content"][0]["text"]
            # Resuming after the second event gives the rest.
            assert events_of(client, task_id, after=2) == events[2:]
            assert client.get(f"/responses/{stored['id']}").json() == stored
            follow_up = client.post(
                "/responses",
                json={
                    "model": service.model_id,
                    "input": [lmsp_user("And?")],
                    "previous_response_id": stored["id"],
                    "max_output_tokens": 4,
                },
            )
            assert follow_up.status_code == 200
    finally:
        stop(service)


@pytest.mark.service
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["killed", "stopped"])
def test_a_task_cut_by_a_stopped_service_reads_as_interrupted(
    tmp_path: Path, sig: signal.Signals
) -> None:
    service = start(tmp_path)
    limit = 2000
    try:
        with service.client() as client:
            created = client.post(
                "/tasks",
                json={
                    "model": service.model_id,
                    "input": [lmsp_user("Hello!")],
                    "max_output_tokens": limit,
                    "extensions": {"min_output_tokens": limit},
                },
            )
            task_id = created.json()["id"]
            seen = 0  # the id of the first text delta a reader saw before the stop
            with client.stream("GET", f"/tasks/{task_id}/events") as answer:
                for line in answer.iter_lines():
                    if line.startswith("id: "):
                        seen = int(line[4:])
                    elif line == "event: response.output_text.delta":
                        break
            assert seen > 1
    finally:
        stop(service, sig)

    service = start(tmp_path)
    try:
        with service.client() as client:
            task = client.get(f"/tasks/{task_id}").json()
            assert task["status"] == "failed"
            assert task["response"]["error"]["code"] == "interrupted"
            events = events_of(client, task_id)
            assert [event_id for event_id, _, _ in events] == list(range(1, len(events) + 1))
            assert events[-1][1] == "response.failed"
            assert events[-1][2]["error"]["code"] == "interrupted"
            if sig == signal.SIGKILL:
                # Only what was written at the start survived the kill; a reader
                # that had seen more is sent to the task.
                assert [e for _, e, _ in events] == ["response.created", "response.failed"]
                lost = client.get(f"/tasks/{task_id}/events", params={"after": seen})
                assert lost.status_code == 410
                assert lost.json()["code"] == "event_history_expired"
            else:
                # A clean stop wrote every event; the reader resumes where it was.
                assert events_of(client, task_id, after=seen) == events[seen:]
    finally:
        stop(service)


# -- the store's limits (no service needed) -------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def finished_run(response_id: str, text: str = "") -> ResponseRun:
    run = ResponseRun(response_id, "m")
    run.emit("response.created", {"response_id": response_id, "status": "in_progress"})
    run.output = [{"type": "message", "content": [{"type": "output_text", "text": text}]}]
    run.finish("completed", "response.completed", {"response_id": response_id})
    return run


def test_records_expire_after_the_retention_period() -> None:
    clock = Clock()
    store = SqliteStore(":memory:", retention_s=60, clock=clock)
    store.save_task(Task("task_1", finished_run("resp_1")))
    clock.now += 30
    store.save_run(finished_run("resp_2"))
    assert store.load_task("task_1") is not None
    clock.now += 31
    store.enforce_limits()
    assert store.load_task("task_1") is None and store.load_run("resp_1") is None
    loaded = store.load_run("resp_2")
    assert loaded is not None and loaded.status == "completed" and loaded.done.is_set()


def test_the_oldest_records_go_first_beyond_the_count_and_size_limits() -> None:
    clock = Clock()
    store = SqliteStore(":memory:", max_records=2, max_bytes=10_000, clock=clock)
    for n in range(3):
        clock.now += 1
        store.save_run(finished_run(f"resp_{n}"))
    assert [store.load_run(f"resp_{n}") is not None for n in range(3)] == [False, True, True]
    clock.now += 1
    store.save_run(finished_run("resp_big", "x" * 9_650))
    assert store.load_run("resp_big") is not None
    assert store.load_run("resp_1") is None and store.load_run("resp_2") is None


def test_an_unreadable_record_is_dropped_not_served(tmp_path: Path) -> None:
    path = tmp_path / "store.sqlite3"
    store = SqliteStore(path)
    store.save_run(finished_run("resp_1"))
    store._db.execute("UPDATE responses SET snapshot = ? WHERE id = ?", ('{"id":NaN}', "resp_1"))
    store.close()
    assert SqliteStore(path).load_run("resp_1") is None


def test_a_full_disk_fails_the_write_and_keeps_what_was_stored(tmp_path: Path) -> None:
    """SQLite's "database or disk is full" is an `sqlite3.Error` the service logs (`_save`)."""
    import sqlite3

    store = SqliteStore(tmp_path / "store.sqlite3")
    store.save_run(finished_run("resp_kept"))
    pages = store._db.execute("PRAGMA page_count").fetchone()[0]
    store._db.execute(f"PRAGMA max_page_count = {pages}")  # the disk is full from here on
    with pytest.raises(sqlite3.Error):
        store.save_run(finished_run("resp_big", "x" * 200_000))
    assert store.load_run("resp_kept") is not None
    assert store.load_run("resp_big") is None


@pytest.mark.service
def test_a_store_that_cannot_be_opened_stops_the_service_with_a_message(tmp_path: Path) -> None:
    import subprocess
    import sys

    pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed")
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the store's folder should be", encoding="utf-8")
    model = Path(__file__).resolve().parents[2] / "models" / "tinychat" / "tiny-chat-q8_0.gguf"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "napllm.lmsp_service",
            "--model",
            str(model),
            "--token-file",
            str(tmp_path / "token"),
            "--store",
            str(blocker / "store.sqlite3"),
            "--port",
            "0",
        ],
        capture_output=True,
        text=True,
        encoding="utf-8",
        env=service_env(),
        timeout=120,
    )
    assert done.returncode == 1
    assert "cannot use the store" in done.stderr
    assert "Traceback" not in done.stderr
