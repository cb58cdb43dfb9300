"""Stored responses and tasks in SQLite, kept across restarts (LMSP 1.0, 6.2, 6.4; docs/lmsp.md).

Rules
- One SQLite file (stdlib `sqlite3`, WAL journal), by default
  `lmsp-store.sqlite3` next to the token file, created readable by the
  user only. Tables: `responses` (the response object, the input context
  for `previous_response_id`, whether it was streamed, its event
  retention), `events` (each held event with its id and wall-clock
  emission time) and `tasks` (task id -> response id).
- What is written: a task's response and a response created with
  `store: true`, once when it starts and once when it reaches its final
  status (with all its held events). Events of a generation in progress
  are not written one by one.
- A clean stop writes each unfinished response as `failed` with the
  `interrupted` problem (app.py). A response that was not final when the
  service was killed or crashed is marked the same way when the store is
  opened again, and a `response.failed` event is appended; its events
  after the first are lost, so a reader resuming past them gets
  `event_history_expired` (6.4) and reads the task instead.
- Limits: a record is deleted `retention_s` seconds after it was last
  written; beyond `max_records` responses or `max_bytes` bytes of JSON
  text, the oldest are deleted first. A task goes with its response.
- Text read back is read by the strict reader (`napllm.jsontext`): the file
  is data, not code.
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import TypeAdapter

from ..jsontext import JsonTextError, read_json
from ..lmsp import InputItem, LmspEvent
from .problems import problem_body
from .tasks import FINAL_STATUSES, ResponseRun, Task, _StoredEvent

_SCHEMA = """
CREATE TABLE IF NOT EXISTS responses (
    id TEXT PRIMARY KEY,
    saved_at REAL NOT NULL,
    bytes INTEGER NOT NULL,
    snapshot TEXT NOT NULL,
    input_context TEXT NOT NULL,
    streamed INTEGER NOT NULL,
    retention_s REAL,
    dropped INTEGER NOT NULL,
    lost_events INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS events (
    response_id TEXT NOT NULL,
    id INTEGER NOT NULL,
    event TEXT NOT NULL,
    data TEXT NOT NULL,
    emitted_at REAL NOT NULL,
    PRIMARY KEY (response_id, id)
);
CREATE TABLE IF NOT EXISTS tasks (
    id TEXT PRIMARY KEY,
    response_id TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS responses_saved_at ON responses (saved_at);
CREATE INDEX IF NOT EXISTS tasks_response ON tasks (response_id);
"""
_ITEMS: TypeAdapter[list[Any]] = TypeAdapter(list[InputItem])
_READ_DEPTH = 80  # input context (request bodies nest at most 64) plus the wrapping


def _dump(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


class StoreCorrupt(Exception):
    """A stored record cannot be read back; it is treated as absent."""


class SqliteStore:
    """Responses and tasks kept in one SQLite file (see the module docstring).

    `path`: the database file (created 0600 when absent) or `":memory:"`;
    `retention_s`: seconds a record is kept after its last write;
    `max_records`: responses kept at most; `max_bytes`: bytes of stored
    JSON text at most; `clock`: wall-clock seconds. Raises `sqlite3.Error`
    or `OSError` when the file cannot be opened.
    """

    def __init__(
        self,
        path: Path | str,
        retention_s: float = 86400.0,
        max_records: int = 1000,
        max_bytes: int = 256 * 1024 * 1024,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if str(path) != ":memory:":
            path = Path(path)
            path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            os.close(os.open(path, os.O_CREAT | os.O_RDWR, 0o600))
        self._db = sqlite3.connect(str(path), isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.executescript(_SCHEMA)
        self.retention_s = retention_s
        self.max_records = max_records
        self.max_bytes = max_bytes
        self._clock = clock
        self._mark_interrupted()
        self.enforce_limits()

    def close(self) -> None:
        """Close the database."""
        self._db.close()

    # -- writing -------------------------------------------------------------------

    def save_run(self, run: ResponseRun) -> None:
        """Write `run` (its response object, input context and held events)."""
        run.prune()
        snapshot = _dump(run.snapshot())
        context = _dump(
            [item.model_dump(mode="json", exclude_none=True) for item in run.input_context]
        )
        events = [
            (run.id, s.event.id, s.event.event, _dump(s.event.data), s.emitted_at)
            for s in run.stored_events()
        ]
        size = len(snapshot) + len(context) + sum(len(row[3]) for row in events)
        with self._db:
            self._db.execute("BEGIN")
            self._db.execute(
                "INSERT OR REPLACE INTO responses VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    run.id,
                    self._clock(),
                    size,
                    snapshot,
                    context,
                    int(run.streamed),
                    run.retention_s,
                    run.dropped,
                    int(run.lost_events),
                ),
            )
            self._db.execute("DELETE FROM events WHERE response_id = ?", (run.id,))
            self._db.executemany("INSERT INTO events VALUES (?, ?, ?, ?, ?)", events)
        self.enforce_limits()

    def save_task(self, task: Task) -> None:
        """Write `task` and its response."""
        self._db.execute("INSERT OR REPLACE INTO tasks VALUES (?, ?)", (task.id, task.run.id))
        self.save_run(task.run)

    def enforce_limits(self) -> None:
        """Delete records past the retention period, then the oldest beyond the size limits."""
        horizon = self._clock() - self.retention_s
        with self._db:
            self._db.execute("BEGIN")
            doomed = [
                row[0]
                for row in self._db.execute(
                    "SELECT id FROM responses WHERE saved_at < ?", (horizon,)
                )
            ]
            count, total = self._db.execute(
                "SELECT COUNT(*), COALESCE(SUM(bytes), 0) FROM responses WHERE saved_at >= ?",
                (horizon,),
            ).fetchone()
            if count > self.max_records or total > self.max_bytes:
                rows = self._db.execute(
                    "SELECT id, bytes FROM responses WHERE saved_at >= ? ORDER BY saved_at, id",
                    (horizon,),
                )
                for response_id, size in rows.fetchall():
                    if count <= self.max_records and total <= self.max_bytes:
                        break
                    doomed.append(response_id)
                    count -= 1
                    total -= size
            for response_id in doomed:
                self._delete(response_id)

    def _delete(self, response_id: str) -> None:
        self._db.execute("DELETE FROM responses WHERE id = ?", (response_id,))
        self._db.execute("DELETE FROM events WHERE response_id = ?", (response_id,))
        self._db.execute("DELETE FROM tasks WHERE response_id = ?", (response_id,))

    def _mark_interrupted(self) -> None:
        """Fail the responses that were not final when the service stopped."""
        for (response_id,) in self._db.execute("SELECT id FROM responses").fetchall():
            try:
                run = self.load_run(response_id)
            except StoreCorrupt:
                with self._db:
                    self._delete(response_id)
                continue
            if run is None or run.status in FINAL_STATUSES:
                continue
            problem = problem_body("interrupted")
            run.lost_events = True
            run.error = problem
            run.finish(
                "failed",
                "response.failed",
                {"response_id": run.id, "status": "failed", "error": problem},
            )
            self.save_run(run)

    # -- reading -------------------------------------------------------------------

    def load_run(self, response_id: str) -> ResponseRun | None:
        """The stored response `response_id` as a `ResponseRun`, or `None`.

        Raises `StoreCorrupt` when the record cannot be read back.
        """
        row = self._db.execute(
            "SELECT snapshot, input_context, streamed, retention_s, dropped, lost_events"
            " FROM responses WHERE id = ?",
            (response_id,),
        ).fetchone()
        if row is None:
            return None
        try:
            snapshot = read_json(row[0], max_depth=_READ_DEPTH)
            context = _ITEMS.validate_python(read_json(row[1], max_depth=_READ_DEPTH))
            events = [
                _StoredEvent(
                    LmspEvent(id=event_id, event=name, data=read_json(data, max_depth=_READ_DEPTH)),
                    emitted_at,
                )
                for event_id, name, data, emitted_at in self._db.execute(
                    "SELECT id, event, data, emitted_at FROM events"
                    " WHERE response_id = ? ORDER BY id",
                    (response_id,),
                )
            ]
            run = ResponseRun.restore(
                snapshot,
                context,
                events,
                streamed=bool(row[2]),
                retention_s=row[3],
                dropped=int(row[4]),
            )
            run.lost_events = bool(row[5])
        except (JsonTextError, ValueError, KeyError, TypeError) as exc:
            raise StoreCorrupt("a stored response cannot be read") from exc
        return run

    def load_task(self, task_id: str) -> Task | None:
        """The stored task `task_id`, or `None` (also when its record is unreadable)."""
        row = self._db.execute("SELECT response_id FROM tasks WHERE id = ?", (task_id,)).fetchone()
        if row is None:
            return None
        try:
            run = self.load_run(row[0])
        except StoreCorrupt:
            return None
        return Task(id=task_id, run=run) if run is not None else None
