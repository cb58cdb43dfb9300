"""Continuous batching in the LMSP service's model worker (scheduler.py, batching.py).

The engine is driven directly with TinyChat: generations that arrive while
others run join their batch, finish, are cancelled or fail inside it, and
greedy answers are the same as when each generation runs alone.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed")

import httpx
from tests.service.conftest import MODEL, LmspServiceHandle

from napllm.lmsp_service.engine import (
    Engine,
    EngineCrashed,
    GenerationEnd,
    GenerationJob,
    TextPiece,
    Update,
)

pytestmark = pytest.mark.service

PROMPTS = ["Hello!", "Hi", "What is your name?", "Tell me a joke.", "Thanks!"]
#: TinyChat's greedy answer to "Hello!" (models/tinychat/README.md).
HELLO_ANSWER = "Hello! How can I help you today?"
LONG = 600  # tokens of a forced long generation


class Run:
    """A sink that records one generation's updates and when it ended."""

    def __init__(self) -> None:
        self.pieces: list[str] = []
        self.end: GenerationEnd | None = None
        self.end_time = 0.0
        self.started = threading.Event()
        self.ended = threading.Event()

    def __call__(self, update: Update) -> None:
        if isinstance(update, TextPiece):
            self.pieces.append(update.text)
            self.started.set()
        else:
            self.end = update
            self.end_time = time.monotonic()
            self.ended.set()

    @property
    def text(self) -> str:
        return "".join(self.pieces)

    def wait(self, timeout_s: float = 120.0) -> GenerationEnd:
        assert self.ended.wait(timeout_s), "the generation did not end"
        assert self.end is not None
        return self.end


def make_engine(slots: int, **options: float) -> Engine:
    return Engine(MODEL, "tinychat", n_ctx=2048, n_threads=1, slots=slots, **options)


@pytest.fixture(scope="module")
def engine() -> Iterator[Engine]:
    engine = make_engine(slots=3)
    yield engine
    engine.close()


def job(engine: Engine, text: str, tokens: int | None = None, **fields: object) -> GenerationJob:
    prompt = engine.tokenize(engine.render([{"role": "user", "content": text}], None))
    forced = {"max_tokens": tokens, "min_output_tokens": tokens} if tokens else {}
    settings = {"max_tokens": None, "temperature": 0.0, **forced, **fields}
    return GenerationJob(prompt_tokens=prompt, **settings)  # type: ignore[arg-type]


def run_alone(engine: Engine, text: str, tokens: int | None = None) -> str:
    run = Run()
    engine.submit(job(engine, text, tokens), run)
    assert run.wait().finish_reason in {"stop", "length"}
    return run.text


def test_concurrent_greedy_answers_equal_the_answers_alone(engine: Engine) -> None:
    alone = {text: run_alone(engine, text) for text in PROMPTS}
    assert alone["Hello!"].startswith(HELLO_ANSWER)
    runs = {text: Run() for text in PROMPTS}  # 5 generations on 3 slots: 2 wait
    for text, run in runs.items():
        engine.submit(job(engine, text), run)
    for text, run in runs.items():
        assert run.wait().finish_reason == "stop"
        assert run.text == alone[text], text


def test_forced_long_answers_equal_the_answers_alone(engine: Engine) -> None:
    alone = run_alone(engine, "Hello!", LONG)
    runs = [Run() for _ in range(3)]
    for run in runs:
        engine.submit(job(engine, "Hello!", LONG), run)
        run.started.wait(30)  # each joins while the others run, at a different position
    for run in runs:
        end = run.wait()
        assert (end.finish_reason, end.output_tokens) == ("length", LONG)
        assert run.text == alone


def test_a_generation_that_arrives_joins_the_running_batch(engine: Engine) -> None:
    long_run, short_run = Run(), Run()
    engine.submit(job(engine, "Hello!", 1500), long_run)
    assert long_run.started.wait(30)
    engine.submit(job(engine, "Hi"), short_run)
    assert short_run.wait().finish_reason == "stop"
    # One generation at a time would have finished the long one first.
    assert not long_run.ended.is_set()
    assert long_run.wait().output_tokens == 1500
    assert short_run.end_time < long_run.end_time


def test_generations_beyond_the_slots_wait_and_then_join(engine: Engine) -> None:
    lengths = [400 * (i + 1) for i in range(engine.slots)]
    first = [Run() for _ in lengths]
    for run, tokens in zip(first, lengths, strict=True):
        engine.submit(job(engine, "Hello!", tokens), run)
    waiting = Run()
    engine.submit(job(engine, "Hi"), waiting)
    for run in first:
        assert run.started.wait(30)
    assert not waiting.started.is_set()  # every slot is taken
    assert waiting.wait().finish_reason == "stop"
    assert [run.wait().output_tokens for run in first] == lengths
    # It started when the shortest of them ended, not after all of them.
    assert waiting.end_time < max(run.end_time for run in first)


@pytest.fixture
def small_engine() -> Iterator[Engine]:
    engine = make_engine(slots=2, cancel_grace_s=30.0)
    yield engine
    engine.close()


def test_cancel_ends_one_generation_and_the_waiting_one_takes_its_slot(
    small_engine: Engine,
) -> None:
    engine = small_engine
    expected = run_alone(engine, "Hello!", 1500)
    cancelled_job = job(engine, "Hello!", 1500)
    kept_job = job(engine, "Hello!", 1500)
    cancelled, kept, waiting = Run(), Run(), Run()
    engine.submit(cancelled_job, cancelled)
    engine.submit(kept_job, kept)
    engine.submit(job(engine, "Hi"), waiting)
    assert cancelled.started.wait(30) and kept.started.wait(30)
    assert not waiting.started.is_set()
    cancelled_job.cancel.set()
    end = cancelled.wait(10)
    assert end.finish_reason == "cancelled"
    assert 0 < end.output_tokens < 1500
    assert waiting.wait().finish_reason == "stop"
    assert not kept.ended.is_set()  # the freed slot served the waiting one at once
    end = kept.wait()
    assert (end.finish_reason, end.output_tokens) == ("length", 1500)
    assert kept.text == expected


def test_a_failing_generation_leaves_the_others_of_its_batch_running(
    small_engine: Engine,
) -> None:
    engine = small_engine
    expected = run_alone(engine, "Hello!", 800)
    kept, failing = Run(), Run()
    engine.submit(job(engine, "Hello!", 800), kept)
    assert kept.started.wait(30)
    # llama.cpp refuses this grammar (an undefined rule): that generation fails alone.
    engine.submit(job(engine, "Hi", grammar="root ::= missing-rule"), failing)
    assert failing.wait().finish_reason == "error"
    assert not kept.ended.is_set()
    end = kept.wait()
    assert (end.finish_reason, end.output_tokens) == ("length", 800)
    assert kept.text == expected


def test_a_grammar_constrains_only_its_own_generation(small_engine: Engine) -> None:
    engine = small_engine
    expected = run_alone(engine, "Hello!")
    free, constrained = Run(), Run()
    engine.submit(job(engine, "Hello!"), free)
    engine.submit(job(engine, "Hello!", grammar='root ::= "yes" | "no"'), constrained)
    assert constrained.wait().finish_reason == "stop"
    assert constrained.text in {"yes", "no"}
    assert free.wait().finish_reason == "stop"
    assert free.text == expected


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="kills the worker by its pid")
def test_a_crash_fails_the_batch_and_the_waiting_generation_survives(
    small_engine: Engine,
) -> None:
    engine = small_engine
    first, second, waiting = Run(), Run(), Run()
    futures = [
        engine.submit(job(engine, "Hello!", 1500), first),
        engine.submit(job(engine, "Hello!", 1500), second),
    ]
    engine.submit(job(engine, "Hi"), waiting)
    assert first.started.wait(30) and second.started.wait(30)
    os.kill(engine.worker_pid, signal.SIGSEGV)
    for run, future in zip((first, second), futures, strict=True):
        assert run.wait().finish_reason == "crashed"
        assert isinstance(future.exception(timeout=30), EngineCrashed)
    assert waiting.wait().finish_reason == "stop"
    assert waiting.text == run_alone(engine, "Hi")
    assert engine.restarts == 1


# -- through the HTTP service ---------------------------------------------------------------


def test_concurrent_http_requests_get_the_answers_of_sequential_ones(
    lmsp_service: LmspServiceHandle,
) -> None:
    def ask(text: str) -> str:
        body = {
            "model": lmsp_service.model_id,
            "input": [
                {
                    "type": "message",
                    "role": "user",
                    "content": [{"type": "input_text", "text": text}],
                }
            ],
            "temperature": 0,
        }
        with httpx.Client(
            base_url=lmsp_service.api, headers=lmsp_service.headers(), timeout=60
        ) as c:
            answer = c.post("/responses", json=body)
        assert answer.status_code == 200
        assert answer.json()["status"] == "completed"
        return str(answer.json()["output"][0]["content"][0]["text"])

    sequential = [ask(text) for text in PROMPTS]
    with ThreadPoolExecutor(len(PROMPTS)) as pool:
        concurrent = list(pool.map(ask, PROMPTS))
    assert concurrent == sequential
    assert sequential[0].startswith(HELLO_ANSWER)


def test_close_ends_the_generations_of_a_worker_it_had_to_kill() -> None:
    # Closing waits `stop_wait_s` for the running generations, then kills
    # the worker; before, a generation it killed never ended (its sink got
    # no end and its future never resolved).
    engine = make_engine(slots=2)
    engine._worker.stop_wait_s = 0.0  # kill at once
    runs = [Run(), Run()]
    for run in runs:
        engine.submit(job(engine, "Hello!", 1900), run)
    assert all(run.started.wait(60) for run in runs)
    engine.close()
    assert [run.wait(10).finish_reason for run in runs] == ["cancelled", "cancelled"]
