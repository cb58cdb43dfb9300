"""The generations of the service process and their hand-off to the model worker (LMSP 1.0, 6.1).

Rules
- Continuous batching, service side: jobs queue here in arrival order and
  are handed to the worker (a `generate` message, worker.py) as soon as it
  has a free slot, so a job that arrives while others run joins their
  batch at the next decoding step; beyond `slots` it waits here.
- Nothing is handed over while the worker is not ready (`ready` clear:
  starting or restarting). `pause` clears it and takes the running jobs in
  one step under the lock the hand-off holds, so no job goes to a dead
  worker; the engine decides what becomes of them (engine.py,
  "Supervision") and `resume` goes on with the queue.
- Cancellation (`CancelFlag.set`) removes a queued job or tells the worker
  to stop the generation, inside the running decoding step if need be
  (llama.cpp's abort callback, batching.py), which frees its slot at once
  and keeps the worker. A worker still running a cancelled generation
  `cancel_grace_s` later (stuck inside llama.cpp, e.g. in a grammar's
  sampling) is killed (`kill_worker`), so a stuck generation cannot hold
  the model for ever; the engine restarts it and the generation ends
  `cancelled` (the others in the worker end `crashed`).
- Time limit: every generation may hold its slot in the worker for
  `time_limit_s` seconds (`GenerationJob.time_limit_s`, by default
  `generation_time_limit_s`); the worker ends it `time` at the limit,
  inside a decoding step if need be, keeping the text produced so far. A
  worker still running it `cancel_grace_s` after the limit is killed as for
  a cancellation; the generation then ends `time` as well (its job is
  `OVERTIME`).
- A job's lifecycle is a table (`JOB_TRANSITIONS`, as napllm.lifecycle's
  generation and endpoint): `QUEUED`, `RUNNING` (in the worker, no text
  yet), `STREAMING`, `OVERTIME`, `ENDED`. Every job ends exactly once
  (`Scheduler.end`: the `END` event is taken once): its sink gets one
  `GenerationEnd`, its future resolves (with the given error, e.g.
  `EngineCrashed`, after a crash) and its watchdog stops. Only a `RUNNING`
  job can go back to the queue after its worker died.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from ..lifecycle import Table
from .batching import EndUpdate, TextUpdate
from .jobs import GenerationEnd, GenerationJob, Sink, TextPiece

log = logging.getLogger("napllm.lmsp_service.scheduler")

#: Seconds a cancelled generation may go on before its worker is killed.
CANCEL_GRACE_S = 10.0
#: Seconds a generation may hold a slot of the worker (`--generation-time-limit-seconds`).
GENERATION_TIME_LIMIT_S = 600.0


class JobState(Enum):
    """Where a scheduled job is (`JOB_TRANSITIONS`)."""

    QUEUED = "queued"  # waiting for a free slot
    RUNNING = "running"  # handed to the worker, no text yet
    STREAMING = "streaming"  # text reached its sink
    OVERTIME = "overtime"  # its worker was killed for running it past its time limit
    ENDED = "ended"  # its sink has its end and its future is resolved


class JobEvent(Enum):
    """What happens to a scheduled job (`JOB_TRANSITIONS`)."""

    DISPATCH = "dispatch"
    TEXT = "text"
    OVERTIME = "overtime"
    REQUEUE = "requeue"  # its worker died before it wrote text; it runs again
    END = "end"


JOB_TRANSITIONS: dict[tuple[JobState, JobEvent], JobState] = {
    (JobState.QUEUED, JobEvent.DISPATCH): JobState.RUNNING,
    (JobState.QUEUED, JobEvent.END): JobState.ENDED,
    (JobState.RUNNING, JobEvent.TEXT): JobState.STREAMING,
    (JobState.RUNNING, JobEvent.OVERTIME): JobState.OVERTIME,
    (JobState.RUNNING, JobEvent.REQUEUE): JobState.QUEUED,
    (JobState.RUNNING, JobEvent.END): JobState.ENDED,
    (JobState.STREAMING, JobEvent.TEXT): JobState.STREAMING,
    (JobState.STREAMING, JobEvent.OVERTIME): JobState.OVERTIME,
    (JobState.STREAMING, JobEvent.END): JobState.ENDED,
    (JobState.OVERTIME, JobEvent.TEXT): JobState.OVERTIME,
    (JobState.OVERTIME, JobEvent.END): JobState.ENDED,
}
"""Every allowed `(state, event) -> next state` of a job; nothing else is.

A job ends once (`ENDED` has no row); only a job that wrote no text may be
run again after its worker died (a generation is never answered twice);
one killed for its time limit ends `time`, never runs again."""


class JobLife(Table[JobState, JobEvent]):
    """One scheduled job's state, changed only through `JOB_TRANSITIONS`.

    Thread-safe: the pipe thread, the watchdogs and the callers move it.
    """

    transitions = JOB_TRANSITIONS
    initial = JobState.QUEUED

    def __init__(self) -> None:
        super().__init__()
        self._lock = threading.Lock()

    def move(self, event: JobEvent) -> bool:
        """Apply `event` if the table allows it now; whether it did."""
        with self._lock:
            if not self.can(event):
                return False
            self.fire(event)
            return True


@dataclass
class ScheduledJob:
    """A submitted job: its request number `rid`, `sink`, `future` and its
    lifecycle `life` (`JOB_TRANSITIONS`); `watchdog`: the timer that kills
    a worker still running it past its time limit.
    """

    rid: int
    job: GenerationJob
    sink: Sink
    future: Future[None]
    life: JobLife = field(default_factory=JobLife)
    watchdog: threading.Timer | None = None

    @property
    def state(self) -> JobState:
        """Where the job is now."""
        return self.life.state


class Scheduler:
    """The job queue and the jobs running in the model worker (module rules).

    `ids`: the request numbers (shared with the engine's tokenizations);
    `send(message)`: sends a message to the worker, raising `OSError`
    when there is none; `kill_worker()`: kills the running worker (the
    engine then restarts it); `slots`: jobs the worker runs at once;
    `cancel_grace_s`, `generation_time_limit_s`: seconds (module rules);
    `prompt_reuse`: whether generations may reuse the KV state earlier ones
    left for the same leading prompt tokens (prompt_cache.py).
    Thread-safe. Starts paused (`ready` clear).
    """

    def __init__(
        self,
        ids: Iterator[int],
        send: Callable[[tuple[Any, ...]], None],
        kill_worker: Callable[[], None],
        slots: int,
        cancel_grace_s: float,
        generation_time_limit_s: float,
        prompt_reuse: bool = True,
    ) -> None:
        self.slots = slots
        self.prompt_reuse = prompt_reuse
        self.cancel_grace_s = cancel_grace_s
        self.generation_time_limit_s = generation_time_limit_s
        self._lock = threading.Lock()  # guards the queue, the running jobs and `ready`
        self._queue: deque[ScheduledJob] = deque()
        self._closed = False  # set by `end_queued`: submissions end at once
        self._running: dict[int, ScheduledJob] = {}  # by request number, in the worker
        #: Set while the worker takes jobs (and tokenizations).
        self.ready = threading.Event()
        # The engine's side: request numbers, the pipe, the kill of a stuck worker.
        self._ids = ids
        self._send = send
        self._kill_worker = kill_worker

    def submit(self, job: GenerationJob, sink: Sink) -> Future[None]:
        """Queue `job` (arrival order); see `engine.Engine.submit`."""
        entry = ScheduledJob(next(self._ids), job, sink, Future())
        with self._lock:
            closed = self._closed
            if not closed:
                self._queue.append(entry)
        if closed:  # after `end_queued`: nothing would ever run it
            self.end(entry, GenerationEnd("cancelled", 0))
            return entry.future
        job.cancel.on_set(lambda: self._cancel(entry))
        self.dispatch()
        return entry.future

    def on_updates(self, updates: list[TextUpdate | EndUpdate]) -> None:
        """Pass the worker's `TextUpdate`s and `EndUpdate`s (worker.py) to their jobs' sinks."""
        ended = False
        for update in updates:
            final = isinstance(update, EndUpdate)
            with self._lock:
                entry = self._running.get(update.rid)
                if entry is not None and final:
                    del self._running[update.rid]
            if entry is None:
                continue  # a late update of a job that already ended
            if isinstance(update, TextUpdate):
                entry.life.move(JobEvent.TEXT)
                entry.sink(TextPiece(str(update.text)))
            elif isinstance(update, EndUpdate):
                self.end(
                    entry,
                    GenerationEnd(
                        update.finish_reason,  # type: ignore[arg-type]
                        int(update.output_tokens),
                        int(update.cached_tokens),
                    ),
                )
                ended = True
        if ended:
            self.dispatch()

    def pause(self) -> list[ScheduledJob]:
        """Stop handing jobs over (the worker died) and take the jobs it was running."""
        with self._lock:
            self.ready.clear()
            running, self._running = list(self._running.values()), {}
        return running

    def requeue_first(self, entries: list[ScheduledJob]) -> None:
        """Put `entries` back at the head of the queue, in their order.

        Only jobs that wrote no text go back (`JOB_TRANSITIONS`); any other
        is left as it is.
        """
        back = [entry for entry in entries if entry.life.move(JobEvent.REQUEUE)]
        for entry in back:
            # Its first run's time limit ends with that run: the next dispatch
            # starts a watchdog of its own.
            if entry.watchdog is not None:
                entry.watchdog.cancel()
                entry.watchdog = None
        with self._lock:
            self._queue.extendleft(reversed(back))

    def resume(self) -> None:
        """A worker is ready: go on handing jobs over."""
        with self._lock:
            self.ready.set()
        self.dispatch()

    def end_queued(self) -> None:
        """End every queued job `cancelled`, and every later submission (the engine is closing)."""
        with self._lock:
            self._closed = True
            queued = list(self._queue)
            self._queue.clear()
        for entry in queued:
            self.end(entry, GenerationEnd("cancelled", 0))

    def dispatch(self) -> None:
        """Hand queued jobs to the worker while it has free slots."""
        while True:
            with self._lock:
                if len(self._running) >= self.slots or not self.ready.is_set() or not self._queue:
                    return
                entry = self._queue.popleft()
                if entry.job.cancel.is_set():
                    cancelled = True
                else:
                    cancelled = False
                    entry.life.move(JobEvent.DISPATCH)
                    self._running[entry.rid] = entry
            if cancelled:
                self.end(entry, GenerationEnd("cancelled", 0))
                continue
            job = entry.job
            limit = self.generation_time_limit_s if job.time_limit_s is None else job.time_limit_s
            payload = {
                "prompt_tokens": job.prompt_tokens,
                "max_tokens": job.max_tokens,
                "temperature": job.temperature,
                "grammar": job.grammar,
                "min_output_tokens": job.min_output_tokens,
                "time_limit_s": limit,
                "grammar_budget_s": job.grammar_budget_s,
                "token_grammar_budget_s": job.token_grammar_budget_s,
                "prompt_reuse": self.prompt_reuse,
            }
            watchdog = threading.Timer(limit + self.cancel_grace_s, self._enforce_limit, (entry,))
            watchdog.daemon = True
            entry.watchdog = watchdog
            watchdog.start()
            try:
                self._send(("generate", entry.rid, payload))
            except OSError:
                return  # the engine notices the dead worker and ends this job

    def _cancel(self, entry: ScheduledJob) -> None:
        with self._lock:
            queued = entry in self._queue
            if queued:
                self._queue.remove(entry)
            running = self._running.get(entry.rid) is entry
        if queued:
            self.end(entry, GenerationEnd("cancelled", 0))
        elif running:
            with contextlib.suppress(OSError):
                self._send(("cancel", entry.rid))
            watchdog = threading.Timer(self.cancel_grace_s, self._enforce_cancel, (entry,))
            watchdog.daemon = True
            watchdog.start()

    def _enforce_cancel(self, entry: ScheduledJob) -> None:
        """Kill a worker that still runs `entry` `cancel_grace_s` after its cancellation.

        Cancellation is checked between tokens and graph nodes; a worker
        stuck inside llama.cpp never gets there. It is treated like a crash
        (restart). The kill happens under the lock `pause` takes, so it hits
        the worker that runs `entry`, never its successor.
        """
        with self._lock:
            if self._running.get(entry.rid) is entry:
                log.error("the model worker ignored a cancellation; stopping it")
                self._kill_worker()

    def _enforce_limit(self, entry: ScheduledJob) -> None:
        """Kill a worker that still runs `entry` `cancel_grace_s` after its time limit.

        The worker ends a generation at its limit, inside a decoding step
        too; one still running here is stuck in llama.cpp (restart as after
        a crash; the generation ends `time`).
        """
        with self._lock:
            if self._running.get(entry.rid) is entry:
                entry.life.move(JobEvent.OVERTIME)
                log.error("the model worker ignored a generation's time limit; stopping it")
                self._kill_worker()

    @staticmethod
    def end(entry: ScheduledJob, end: GenerationEnd, error: Exception | None = None) -> None:
        """End `entry` once: stop its watchdog, tell its sink, resolve its future."""
        if not entry.life.move(JobEvent.END):
            return
        if entry.watchdog is not None:
            entry.watchdog.cancel()
        entry.sink(end)
        if error is None:
            entry.future.set_result(None)
        else:
            entry.future.set_exception(error)
