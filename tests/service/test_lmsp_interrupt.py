"""Cancellation and the time limit stop a generation inside a decoding step (batching.py).

A decoding step that holds a long prompt can take longer than
`cancel_grace_s` on a large model and a slow CPU. TinyChat decodes 512
tokens in milliseconds, so `slow_prompt_worker` makes llama.cpp itself slow
on such steps: it asks llama.cpp's scheduler to hand over every graph node
of a step with more than `BIG_STEP` tokens (`cb_eval`) and sleeps there.
llama.cpp then really is inside `llama_decode` for seconds, between graph
nodes, which is where its abort callback is checked; single-token steps stay
fast.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import threading
import time
from collections.abc import Iterator
from multiprocessing.connection import Connection
from typing import Any

import pytest

pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed")

from tests.service.conftest import MODEL
from tests.service.test_lmsp_batching import Run, job, run_alone

from napllm.lmsp_service.engine import Engine, EngineCrashed

pytestmark = pytest.mark.service

#: Steps with more tokens than this are slowed down (prompt steps).
BIG_STEP = 64
#: Seconds llama.cpp is held after each graph node of a slowed step.
SLOW_NODE_S = 0.05
#: The engine's grace period for a cancelled generation in these tests.
GRACE_S = 2.0
#: A user message of about 1500 tokens: three prompt steps of 512.
LONG_TEXT = "Tell me a joke. " * 150

_observe: Any = None  # the callback object, kept alive in the worker process


def slow_prompt_worker(
    conn: Connection,
    model_path: str,
    n_ctx: int,
    n_threads: int | None,
    extra_bufts: bool = True,
    slots: int = 4,
) -> None:
    """`worker_main` whose decoding steps of more than `BIG_STEP` tokens take seconds."""
    global _observe
    import llama_cpp

    from napllm.lmsp_service import batch_load, worker

    slow = [False]

    def observe(_tensor: int, ask: bool, _data: int) -> bool:
        if ask:
            return slow[0]  # True: compute up to this node, then call again
        time.sleep(SLOW_NODE_S)
        return True  # go on (False would silently skip the rest of the graph)

    _observe = llama_cpp.ggml_backend_sched_eval_callback(observe)
    decode = llama_cpp.llama_decode

    def slow_decode(ctx: Any, batch: Any) -> int:
        slow[0] = batch.n_tokens > BIG_STEP
        try:
            return int(decode(ctx, batch))
        finally:
            slow[0] = False

    llama_cpp.llama_decode = slow_decode
    params = batch_load.context_params

    def observed_params(*args: Any) -> Any:
        result = params(*args)
        result.cb_eval = _observe
        result.cb_eval_user_data = ctypes.c_void_p()
        return result

    batch_load.context_params = observed_params
    worker.worker_main(conn, model_path, n_ctx, n_threads, extra_bufts, slots)


@pytest.fixture(scope="module")
def engine() -> Iterator[Engine]:
    engine = Engine(
        MODEL,
        "tinychat",
        n_ctx=2048,
        n_threads=1,
        slots=2,
        cancel_grace_s=GRACE_S,
        worker_target=slow_prompt_worker,
    )
    yield engine
    engine.close()


def wait_until_decoding(engine: Engine) -> None:
    """Give the worker the moment it needs to receive a job and enter its first step."""
    time.sleep(0.5)


def test_cancel_stops_a_long_prompt_step_and_keeps_the_worker(engine: Engine) -> None:
    expected = run_alone(engine, "Hello!", 60)
    restarts = engine.restarts
    kept, long = Run(), Run()
    engine.submit(job(engine, "Hello!", 60), kept)
    assert kept.started.wait(60)
    long_job = job(engine, LONG_TEXT, 5)
    assert len(long_job.prompt_tokens) > 1024
    engine.submit(long_job, long)
    wait_until_decoding(engine)
    assert not long.ended.is_set()
    cancelled_at = time.monotonic()
    long_job.cancel.set()
    end = long.wait(60)
    latency = long.end_time - cancelled_at
    assert (end.finish_reason, end.output_tokens) == ("cancelled", 0)
    # Stopped inside the step, long before the grace period ran out.
    assert latency < GRACE_S / 2, f"the cancellation took {latency:.2f} s"
    assert engine.restarts == restarts  # the worker was not killed
    # The generation that shared the aborted step goes on as if nothing happened.
    end = kept.wait()
    assert (end.finish_reason, end.output_tokens) == ("length", 60)
    assert kept.text == expected


def test_the_time_limit_stops_a_long_prompt_step_and_keeps_the_worker(engine: Engine) -> None:
    restarts = engine.restarts
    long = Run()
    limited = job(engine, LONG_TEXT, 5, time_limit_s=1.0)
    started = time.monotonic()
    engine.submit(limited, long)
    end = long.wait(60)
    took = long.end_time - started
    assert (end.finish_reason, end.output_tokens) == ("time", 0)
    assert took < 1.0 + GRACE_S / 2, f"the limit took {took:.2f} s"
    assert engine.restarts == restarts
    assert run_alone(engine, "Hi")  # the same worker answers the next one


def test_the_time_limit_ends_a_long_generation_between_tokens(engine: Engine) -> None:
    run = Run()
    future = engine.submit(job(engine, "Hello!", 1500, time_limit_s=0.5), run)
    end = run.wait(60)
    assert end.finish_reason == "time"
    assert 0 < end.output_tokens < 1500
    assert run.text  # the output up to the limit is kept
    assert future.result(timeout=5) is None


def test_a_long_tokenization_does_not_delay_a_cancellation(engine: Engine) -> None:
    restarts = engine.restarts
    run = Run()
    long_job = job(engine, "Hello!", 1500)
    engine.submit(long_job, run)
    assert run.started.wait(60)
    # 1 MiB of prompt: seconds of llama.cpp's tokenizer in the worker.
    big = "Tell me a joke. " * 65536

    def tokenize() -> None:
        with contextlib.suppress(EngineCrashed):
            engine.tokenize(big, timeout_s=300)

    threading.Thread(target=tokenize, daemon=True).start()
    wait_until_decoding(engine)
    cancelled_at = time.monotonic()
    long_job.cancel.set()
    end = run.wait(60)
    latency = run.end_time - cancelled_at
    assert end.finish_reason == "cancelled"
    assert latency < GRACE_S / 2, f"the cancellation took {latency:.2f} s"
    assert engine.restarts == restarts


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="stops the worker by its pid")
def test_a_worker_stuck_past_a_time_limit_is_replaced() -> None:
    engine = Engine(MODEL, "tinychat", n_ctx=2048, n_threads=1, slots=1, cancel_grace_s=1.0)
    try:
        run = Run()
        future = engine.submit(job(engine, "Hello!", 1500, time_limit_s=0.5), run)
        assert run.started.wait(60)
        # Stuck inside llama.cpp, as far as the service can tell.
        os.kill(engine.worker_pid, signal.SIGSTOP)
        end = run.wait(30)
        assert end.finish_reason == "time"  # not "crashed": it ended at its limit
        assert future.exception(timeout=5) is None
        assert run_alone(engine, "Hi")  # a new worker answers the next one
        assert engine.restarts == 1
    finally:
        engine.close()
