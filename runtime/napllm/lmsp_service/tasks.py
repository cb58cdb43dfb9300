"""Responses in flight, tasks, stored responses and event history (LMSP 1.0, 6.2-6.4; docs/lmsp.md).

Rules
- A `ResponseRun` is one response being generated: its status, output items,
  usage, and the ordered events with integer ids from 1 (6.4). It lives on
  the event loop; the generation itself runs on the engine's thread.
- Statuses move `queued` -> `in_progress` -> one final status
  (`completed`, `incomplete`, `failed`, `cancelled`); the final event
  (`response.completed`, `response.incomplete`, `response.failed`,
  `response.cancelled`) is the last one (6.3).
- A task (assumed 7.4, docs/lmsp.md) owns one run that outlives any HTTP
  connection. Its events are kept for `retention_s` seconds after they were
  emitted; a reader asking for events of which some were dropped gets
  `EventHistoryExpired` (410 `event_history_expired`, 6.4) and then reads
  the final response from the task.
- A response streamed directly by `POST /lmsp/v1/responses` is read live by
  its one connection and keeps its events until it ends (6.4: it cannot be
  resumed).
- Stores are bounded (oldest entries evicted first) so a long-running
  service does not grow without limit.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from ..lmsp import TERMINAL_EVENTS, LmspEvent


@dataclass(frozen=True)
class Outcome:
    """How a response run ends: one row of `OUTCOMES` (6.2, 6.3).

    `status`: the final status; `event`: the final event; `keeps_output`:
    the output generated so far stays in the response (its open items
    closed); `problem`: for `failed`, the problem code (`problems.PROBLEM_CODES`)
    and `detail` its detail (None: the code's own); `incomplete_reason`: for
    `incomplete`, `incomplete_details.reason`; `usage`: the final event
    carries the usage.
    """

    status: str
    event: str
    keeps_output: bool = False
    problem: str | None = None
    detail: str | None = None
    incomplete_reason: str | None = None
    usage: bool = False


def _failed(problem: str, detail: str | None = None) -> Outcome:
    return Outcome("failed", "response.failed", problem=problem, detail=detail)


def _incomplete(reason: str) -> Outcome:
    return Outcome("incomplete", "response.incomplete", True, incomplete_reason=reason, usage=True)


#: The detail of a generation ended for its grammar work (batching.py's budgets).
GRAMMAR_BUDGET_DETAIL = (
    "The response's schema made the model's sampling too costly; the generation was ended."
)

#: Every way a run ends, by the generation's finish reason (`jobs.FinishReason`)
#: or by what the service saw: `crashed-cancelled` (the worker was killed
#: because it ignored its cancellation: cancelled, its output as it stood),
#: `output-invalid` (the output broke its tool-call syntax or its schema),
#: `interrupted` (the service stopped), `internal-error` (a bug of ours, or a
#: finish reason this table lacks).
OUTCOMES: dict[str, Outcome] = {
    "stop": Outcome("completed", "response.completed", True, usage=True),
    "length": _incomplete("max_output_tokens"),
    "time": _incomplete("max_generation_time"),
    "cancelled": Outcome("cancelled", "response.cancelled", True),
    "crashed-cancelled": Outcome("cancelled", "response.cancelled"),
    "error": _failed("generation_failed"),
    "grammar": _failed("generation_failed", GRAMMAR_BUDGET_DETAIL),
    "crashed": _failed("model_crashed"),
    "output-invalid": _failed("model_output_invalid"),
    "interrupted": _failed("interrupted"),
    "internal-error": _failed("internal_error"),
}

FINAL_STATUSES = frozenset(outcome.status for outcome in OUTCOMES.values())


def outcome_of(finish_reason: str, *, cancel_requested: bool) -> Outcome:
    """The row for a generation's finish reason (`internal-error` for one not in the table).

    A worker that crashed after its cancellation was asked for ended
    because it ignored it: `crashed-cancelled`.
    """
    if finish_reason == "crashed" and cancel_requested:
        return OUTCOMES["crashed-cancelled"]
    return OUTCOMES.get(finish_reason, OUTCOMES["internal-error"])


class EventHistoryExpired(Exception):
    """The requested events are older than the retention period (6.4)."""


class EventCursorInvalid(Exception):
    """The requested resume point is after the last event of the response."""


class CancelFlag(threading.Event):
    """A `threading.Event` that also runs callbacks when it is set (thread-safe).

    The engine registers one to forward a cancellation to the worker.
    """

    def __init__(self) -> None:
        super().__init__()
        self._callbacks: list[Callable[[], None]] = []
        self._callback_lock = threading.Lock()

    def on_set(self, callback: Callable[[], None]) -> None:
        """Run `callback` when the flag is set (at once if it already is)."""
        with self._callback_lock:
            if not self.is_set():
                self._callbacks.append(callback)
                return
        callback()

    def set(self) -> None:
        """Set the flag and run the registered callbacks once."""
        with self._callback_lock:
            super().set()
            callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            callback()


@dataclass
class _StoredEvent:
    event: LmspEvent
    emitted_at: float


class ResponseRun:
    """One response: its state, output and event history.

    `response_id` (`resp_...`), `model` (the model id) and `retention_s`
    (seconds an event is kept after its emission; `None` keeps all). Event
    data always include `response_id` (6.3). `clock` returns wall-clock
    seconds (stored with each event, so retention holds across restarts).
    `lost_events` is set on a response restored after an interruption:
    its events after the first were never stored.
    """

    def __init__(
        self,
        response_id: str,
        model: str,
        retention_s: float | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.id = response_id
        self.model = model
        self.created_at = int(time.time())
        self.status = "queued"
        self.output: list[dict[str, Any]] = []
        self.usage: dict[str, Any] | None = None
        self.error: dict[str, Any] | None = None
        self.incomplete_details: dict[str, Any] | None = None
        self.cancel_flag = CancelFlag()
        self.streamed = False  # answered as a direct stream (replayed as one)
        self.persistent = False  # a task's run or a `store: true` response (store.py)
        self.input_context: list[Any] = []  # input items, for previous_response_id
        self.retention_s = retention_s
        self.lost_events = False
        self._clock = clock
        self._events: list[_StoredEvent] = []
        self._dropped = 0  # events pruned from the front; ids 1..dropped are gone
        self._next_id = 1
        self._changed = asyncio.Event()
        self.done = asyncio.Event()

    # -- producing -----------------------------------------------------------

    def emit(self, event: str, data: dict[str, Any]) -> LmspEvent:
        """Append one event with the next id and return it.

        Raises `RuntimeError` after the final event (6.3: it is the last one).
        """
        if self.done.is_set():
            raise RuntimeError("event after the final event")
        record = LmspEvent(id=self._next_id, event=event, data=data)
        self._next_id += 1
        self._events.append(_StoredEvent(record, self._clock()))
        if event in TERMINAL_EVENTS:
            self.done.set()
        self._changed.set()
        self._changed = asyncio.Event()
        return record

    def finish(self, status: str, event: str, data: dict[str, Any]) -> None:
        """Set the final `status` and emit the final `event` with `data`."""
        self.status = status
        self.emit(event, data)

    def end(self, outcome: Outcome, problem: dict[str, Any] | None = None) -> None:
        """End the run as `outcome` says (`OUTCOMES`): its status, final event and data.

        `problem`: the problem object of a `failed` outcome (built by the
        service from `outcome.problem` and `outcome.detail`). Raises
        `RuntimeError` when the run already ended.
        """
        data: dict[str, Any] = {"response_id": self.id, "status": outcome.status}
        if outcome.problem is not None:
            self.error = problem
            data["error"] = problem
        if outcome.incomplete_reason is not None:
            self.incomplete_details = {"reason": outcome.incomplete_reason}
            data["incomplete_details"] = self.incomplete_details
        if outcome.usage:
            data["usage"] = self.usage
        self.finish(outcome.status, outcome.event, data)

    @property
    def last_event_id(self) -> int:
        """Id of the latest event, 0 before the first one."""
        return self._next_id - 1

    # -- reading ---------------------------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        """The response object (6.2) as it stands now."""
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": self.status,
            "model": self.model,
            "output": list(self.output),
            "usage": self.usage,
            "error": self.error,
            "incomplete_details": self.incomplete_details,
        }

    def prune(self) -> None:
        """Drop events older than the retention period."""
        if self.retention_s is None:
            return
        horizon = self._clock() - self.retention_s
        keep = 0
        while keep < len(self._events) and self._events[keep].emitted_at < horizon:
            keep += 1
        if keep:
            del self._events[:keep]
            self._dropped += keep

    def check_cursor(self, after: int) -> None:
        """Validate a resume point: raises `EventCursorInvalid` or `EventHistoryExpired`."""
        if after > self.last_event_id and self.lost_events:
            raise EventHistoryExpired
        if after < 0 or after > self.last_event_id:
            raise EventCursorInvalid
        self.prune()
        if after < self._dropped:
            raise EventHistoryExpired

    async def follow(self, after: int = 0) -> AsyncIterator[LmspEvent]:
        """Yield the events with ids greater than `after`, live, up to the final one.

        Raises `EventHistoryExpired` when some of them were pruned, also
        while following (a reader that fell behind by the retention period).
        """
        self.check_cursor(after)
        while True:
            changed = self._changed
            self.prune()
            if after < self._dropped:
                raise EventHistoryExpired
            pending = [stored.event for stored in self._events[after - self._dropped :]]
            for record in pending:
                yield record
                after = record.id if record.id is not None else after
                if record.terminal:
                    return
            if self.done.is_set() and after >= self.last_event_id:
                return
            await changed.wait()

    @property
    def dropped(self) -> int:
        """How many events were pruned from the front (ids 1..dropped are gone)."""
        return self._dropped

    def stored_events(self) -> list[_StoredEvent]:
        """The events still held with their emission times, oldest first."""
        return list(self._events)

    @classmethod
    def restore(
        cls,
        snapshot: dict[str, Any],
        input_context: list[Any],
        events: list[_StoredEvent],
        *,
        streamed: bool,
        retention_s: float | None,
        dropped: int,
    ) -> ResponseRun:
        """Rebuild a run from its stored response object (`snapshot`) and events.

        Raises `KeyError`/`TypeError`/`ValueError` for a malformed record.
        """
        run = cls(str(snapshot["id"]), str(snapshot["model"]), retention_s=retention_s)
        run.created_at = int(snapshot["created_at"])
        run.status = str(snapshot["status"])
        run.output = list(snapshot["output"])
        run.usage = snapshot["usage"]
        run.error = snapshot["error"]
        run.incomplete_details = snapshot["incomplete_details"]
        run.streamed = streamed
        run.input_context = input_context
        run._events = list(events)
        run._dropped = dropped
        run._next_id = (events[-1].event.id or dropped) + 1 if events else dropped + 1
        if any(stored.event.terminal for stored in events) or run.status in FINAL_STATUSES:
            run.done.set()
        return run

    def all_events(self) -> list[LmspEvent]:
        """The events still held, oldest first."""
        return [stored.event for stored in self._events]


@dataclass
class Task:
    """A task (assumed 7.4): `task_...` id and the run generating its response."""

    id: str
    run: ResponseRun

    def to_json(self) -> dict[str, Any]:
        """`{"id", "object": "task", "status", "response_id", "response"}`.

        `response` is the response object once the status is final, else null.
        """
        final = self.run.status in FINAL_STATUSES
        return {
            "id": self.id,
            "object": "task",
            "status": self.run.status,
            "response_id": self.run.id,
            "response": self.run.snapshot() if final else None,
        }


K = TypeVar("K")
V = TypeVar("V")


class BoundedStore(Generic[K, V]):
    """A mapping that forgets its oldest entries beyond `capacity`."""

    def __init__(self, capacity: int) -> None:
        self._capacity = capacity
        self._items: OrderedDict[K, V] = OrderedDict()

    def put(self, key: K, value: V) -> None:
        """Insert or replace `key`, evicting the oldest entries when full."""
        self._items[key] = value
        self._items.move_to_end(key)
        while len(self._items) > self._capacity:
            self._items.popitem(last=False)

    def get(self, key: K) -> V | None:
        """The value for `key`, or `None`."""
        return self._items.get(key)

    def pop(self, key: K) -> V | None:
        """Remove and return the value for `key`, or `None`."""
        return self._items.pop(key, None)

    def __len__(self) -> int:
        return len(self._items)
