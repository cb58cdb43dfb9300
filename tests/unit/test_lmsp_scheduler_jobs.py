"""A scheduled job's lifecycle in napllm-lmsp (lmsp_service/scheduler.py `JOB_TRANSITIONS`).

The scheduler is driven without a worker: `send` records the messages,
the worker's updates are handed to `on_updates` by the test. Checked: a
job moves queued -> running -> streaming -> ended and ends once; a job
that wrote text is never queued again after its worker died, one that
wrote none is, at the head; a job killed for its time limit is overtime
and ends once.
"""

from __future__ import annotations

import itertools
import time
from typing import Any

import pytest

pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed")

from napllm.lmsp_service.batching import EndUpdate, TextUpdate
from napllm.lmsp_service.jobs import GenerationEnd, GenerationJob
from napllm.lmsp_service.scheduler import JOB_TRANSITIONS, JobEvent, JobState, Scheduler


def scheduler(slots: int = 2) -> tuple[Scheduler, list[tuple[Any, ...]], list[str]]:
    sent: list[tuple[Any, ...]] = []
    kills: list[str] = []
    jobs = Scheduler(
        itertools.count(1), sent.append, lambda: kills.append("kill"), slots,
        cancel_grace_s=60, generation_time_limit_s=60,
    )  # fmt: skip
    jobs.resume()
    return jobs, sent, kills


def submit(jobs: Scheduler) -> tuple[Any, list[Any]]:
    seen: list[Any] = []
    future = jobs.submit(
        GenerationJob(prompt_tokens=[1, 2], max_tokens=4, temperature=0), seen.append
    )
    return future, seen


def test_the_table_ends_every_state_once_and_requeues_only_a_silent_job() -> None:
    ended = {state for (state, event), _ in JOB_TRANSITIONS.items() if event is JobEvent.END}
    assert ended == set(JobState) - {JobState.ENDED}
    assert not any(state is JobState.ENDED for state, _ in JOB_TRANSITIONS)
    requeued = [state for (state, event) in JOB_TRANSITIONS if event is JobEvent.REQUEUE]
    assert requeued == [JobState.RUNNING]


def test_a_job_runs_streams_and_ends_once() -> None:
    jobs, sent, _ = scheduler()
    future, seen = submit(jobs)
    entry = jobs.pause()[0]
    assert entry.state is JobState.RUNNING and sent[0][0] == "generate"
    jobs.requeue_first([entry])
    assert entry.state is JobState.QUEUED
    jobs.resume()
    rid = sent[-1][1]
    jobs.on_updates([TextUpdate(rid, "Hi")])
    assert entry.state is JobState.STREAMING
    jobs.on_updates([EndUpdate(rid, "stop", 1)])
    assert entry.state is JobState.ENDED and future.done()
    Scheduler.end(entry, GenerationEnd("crashed", 0))  # a second end is refused
    assert [type(x).__name__ for x in seen] == ["TextPiece", "GenerationEnd"]


def test_a_job_that_wrote_text_is_never_queued_again() -> None:
    jobs, sent, _ = scheduler()
    submit(jobs)
    jobs.on_updates([TextUpdate(sent[0][1], "Hi")])
    running = jobs.pause()
    jobs.requeue_first(running)
    jobs.resume()
    assert [m[0] for m in sent] == ["generate"]  # not handed over again
    assert running[0].state is JobState.STREAMING


def test_a_job_killed_for_its_time_limit_is_overtime_and_ends_once() -> None:
    jobs, _, kills = scheduler()
    future, seen = submit(jobs)
    (entry,) = list(jobs._running.values())
    jobs._enforce_limit(entry)
    assert kills == ["kill"] and entry.state is JobState.OVERTIME
    jobs.requeue_first(jobs.pause())  # overtime is not run again
    assert entry.state is JobState.OVERTIME
    Scheduler.end(entry, GenerationEnd("time", 0))
    Scheduler.end(entry, GenerationEnd("crashed", 0))
    assert future.done() and [x.finish_reason for x in seen] == ["time"]


def test_a_requeued_job_is_not_killed_by_its_first_runs_time_limit() -> None:
    sent: list[tuple[Any, ...]] = []
    kills: list[float] = []
    jobs = Scheduler(
        itertools.count(1), sent.append, lambda: kills.append(time.monotonic()), 2,
        cancel_grace_s=0.1, generation_time_limit_s=1.0,
    )  # fmt: skip
    jobs.resume()
    submit(jobs)
    time.sleep(0.4)  # the worker dies 0.4 s into the first run
    jobs.requeue_first(jobs.pause())
    started = time.monotonic()
    jobs.resume()  # handed over again: a full 1 s limit of its own
    time.sleep(0.9)  # the first run's watchdog would have fired at 0.7 s
    assert kills == [], "killed by the first run's watchdog"
    time.sleep(0.7)
    assert len(kills) == 1 and kills[0] - started >= 1.05


def test_a_job_submitted_after_close_ends_at_once() -> None:
    # Before, it waited in the queue of a closed engine for ever.
    jobs, sent, _ = scheduler()
    jobs.end_queued()  # the engine closes
    future, seen = submit(jobs)
    assert future.done() and future.result() is None
    assert seen == [GenerationEnd("cancelled", 0)]
    assert sent == []
