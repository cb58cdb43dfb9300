"""Any CPU: a model worker that crashes with llama.cpp's CPU fast path on is restarted without it.

The workers here are real `spawn` processes that really die by a
segmentation fault (a read of address 0 through ctypes, as a faulting
kernel would), wrapped around the product's `worker_main`: they crash
only while the fast path (llama.cpp's extra buffer types) is on, the way
llama.cpp 0.3.36 does on Xeons with AMX. On such a machine the plain
service tests see the real thing; these make the same happen everywhere.
"""

from __future__ import annotations

import ctypes
import logging
import multiprocessing
import os
import signal
import subprocess
import sys
import threading
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed")

from napllm.lmsp_service.engine import (
    Engine,
    GenerationEnd,
    GenerationJob,
    TextPiece,
    WorkerCrashed,
)
from napllm.lmsp_service.llama_load import crash_signal
from napllm.lmsp_service.worker import DEFAULT_SLOTS, worker_main

REPO = Path(__file__).resolve().parents[2]
MODEL = REPO / "models" / "tinychat" / "tiny-chat-q8_0.gguf"

pytestmark = pytest.mark.service


def segfault() -> None:
    """Die by a real SIGSEGV: read address 0 from native code."""
    ctypes.string_at(0)


def crash_while_loading(
    conn: Connection,
    model_path: str,
    n_ctx: int,
    n_threads: int | None,
    extra_bufts: bool = True,
    slots: int = DEFAULT_SLOTS,
) -> None:
    """`worker_main`, except that with the fast path on it faults before it is ready."""
    if extra_bufts:
        segfault()
    worker_main(conn, model_path, n_ctx, n_threads, extra_bufts, slots)


class _FaultOnGenerate:
    """A worker's pipe end standing for a fast path that passes the self-check, then faults.

    It reports the fast path as in use and faults the process when a
    generation arrives. The model itself is loaded without the fast path,
    so the self-check passes on every CPU (also on one where the real fast
    path would already crash there).
    """

    def __init__(self, conn: Connection) -> None:
        self._conn = conn

    def recv(self) -> Any:
        message = self._conn.recv()
        if message[0] == "generate":
            segfault()
        return message

    def send(self, message: Any) -> None:
        if message[0] == "ready":
            message = ("ready", {**message[1], "extra_bufts": True})
        self._conn.send(message)


def crash_on_generate(
    conn: Connection,
    model_path: str,
    n_ctx: int,
    n_threads: int | None,
    extra_bufts: bool = True,
    slots: int = DEFAULT_SLOTS,
) -> None:
    """`worker_main`, except that with the fast path on it faults on the first generation."""
    if extra_bufts:
        worker_main(_FaultOnGenerate(conn), model_path, n_ctx, n_threads, False, slots)  # type: ignore[arg-type]
    else:
        worker_main(conn, model_path, n_ctx, n_threads, False, slots)


class _FaultOnSecondGenerate(_FaultOnGenerate):
    """Like `_FaultOnGenerate`, but the fault comes with the second generation.

    The first generation is then running in the batch (and may have
    streamed text) when the worker dies.
    """

    def __init__(self, conn: Connection) -> None:
        super().__init__(conn)
        self._generations = 0

    def recv(self) -> Any:
        message = self._conn.recv()
        if message[0] == "generate":
            self._generations += 1
            if self._generations == 2:
                segfault()
        return message


def crash_on_second_generate(
    conn: Connection,
    model_path: str,
    n_ctx: int,
    n_threads: int | None,
    extra_bufts: bool = True,
    slots: int = DEFAULT_SLOTS,
) -> None:
    """`worker_main`, except that with the fast path on it faults on the second generation.

    Like `crash_on_generate_then_in_check`, every later worker started with
    the fast path on faults while loading (the fast path is really broken).
    """
    marker = Path(os.environ[MARKER_ENV])
    if extra_bufts and marker.exists():
        segfault()
    if extra_bufts:
        marker.write_text("faulted", encoding="utf-8")
        worker_main(_FaultOnSecondGenerate(conn), model_path, n_ctx, n_threads, False, slots)  # type: ignore[arg-type]
    else:
        worker_main(conn, model_path, n_ctx, n_threads, False, slots)


def answer(engine: Engine, text: str) -> tuple[str, GenerationEnd]:
    """Greedy answer of `engine` to one user message, and how it ended."""
    prompt = engine.render([{"role": "user", "content": text}], None)
    job = GenerationJob(engine.tokenize(prompt), max_tokens=40, temperature=0.0)
    pieces: list[str] = []
    ends: list[GenerationEnd] = []
    done = threading.Event()

    def sink(update: Any) -> None:
        if isinstance(update, TextPiece):
            pieces.append(update.text)
        else:
            ends.append(update)
            done.set()

    engine.submit(job, sink)
    assert done.wait(120), "the generation did not end"
    (end,) = ends
    return "".join(pieces), end


@pytest.fixture(scope="module")
def reference() -> str:
    """TinyChat's greedy answer to "Hello!" from a worker without the fast path."""
    engine = Engine(MODEL, "tinychat", n_ctx=512, n_threads=1, extra_bufts="off")
    try:
        text, end = answer(engine, "Hello!")
    finally:
        engine.close()
    assert end.finish_reason == "stop"
    return text


def test_crash_signal_reads_exit_codes() -> None:
    assert crash_signal(-signal.SIGSEGV) is signal.SIGSEGV
    assert crash_signal(-signal.SIGABRT) is signal.SIGABRT
    assert crash_signal(-signal.SIGKILL) is None  # the service's own kill, or the OOM killer
    assert crash_signal(0) is None
    assert crash_signal(1) is None
    assert crash_signal(None) is None


def test_worker_that_crashes_while_loading_falls_back_once(
    caplog: pytest.LogCaptureFixture, reference: str
) -> None:
    caplog.set_level(logging.WARNING, logger="napllm.lmsp_service.worker_process")
    engine = Engine(MODEL, "tinychat", n_ctx=512, n_threads=1, worker_target=crash_while_loading)
    try:
        fast = engine.fast_path
        assert fast.setting == "auto"
        assert fast.enabled is False
        assert fast.reason is not None
        assert "SIGSEGV" in fast.reason and "loaded" in fast.reason
        assert fast.cpu  # llama.cpp's CPU summary reaches the report
        text, end = answer(engine, "Hello!")
        assert (text, end.finish_reason) == (reference, "stop")
        text, end = answer(engine, "Hello!")
        assert (text, end.finish_reason) == (reference, "stop")
    finally:
        engine.close()
    warnings = [r for r in caplog.records if "fast path" in r.getMessage()]
    assert len(warnings) == 1


#: Environment variable naming a marker file: set, `crash_on_generate_then_in_check`
#: has already faulted once (a spawned worker learns it from the file).
MARKER_ENV = "NAPLLM_TEST_CRASH_MARKER"


def crash_on_generate_then_in_check(
    conn: Connection,
    model_path: str,
    n_ctx: int,
    n_threads: int | None,
    extra_bufts: bool = True,
    slots: int = DEFAULT_SLOTS,
) -> None:
    """A fast path that passes its first self-check, faults in a generation, then in every check.

    The first worker behaves like `crash_on_generate`; every later worker
    started with the fast path on faults while loading (the self-check);
    without it, the real worker runs.
    """
    marker = Path(os.environ[MARKER_ENV])
    if extra_bufts and marker.exists():
        segfault()
    if extra_bufts:
        marker.write_text("faulted", encoding="utf-8")
    crash_on_generate(conn, model_path, n_ctx, n_threads, extra_bufts, slots)


def test_a_request_crash_blamed_on_the_fast_path_by_the_next_self_check_is_answered(
    reference: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(MARKER_ENV, str(tmp_path / "faulted"))
    engine = Engine(
        MODEL, "tinychat", n_ctx=512, n_threads=1, worker_target=crash_on_generate_then_in_check
    )
    try:
        assert engine.fast_path.enabled is True
        assert engine.fast_path.reason is None
        text, end = answer(engine, "Hello!")
        assert (text, end.finish_reason) == (reference, "stop")
        assert engine.restarts == 1
        fast = engine.fast_path
        assert fast.enabled is False
        assert fast.reason is not None and "during a generation and again" in fast.reason
        # The next request goes straight to the new worker (the same prompt
        # again: its prefix is reused there, all but the last token).
        again, again_end = answer(engine, "Hello!")
        assert (again, again_end.finish_reason, again_end.output_tokens) == (
            reference,
            end.finish_reason,
            end.output_tokens,
        )
        assert again_end.cached_tokens > 0
        assert engine.restarts == 1
    finally:
        engine.close()


def test_crash_in_a_batch_reruns_only_the_generations_without_text(
    reference: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(MARKER_ENV, str(tmp_path / "faulted"))
    engine = Engine(
        MODEL,
        "tinychat",
        n_ctx=512,
        n_threads=1,
        slots=2,
        worker_target=crash_on_second_generate,
    )
    try:
        prompt = engine.render([{"role": "user", "content": "Hello!"}], None)
        # The first generation cannot stop early, so it is still running
        # (with text already streamed) when the second one crashes the batch.
        long_job = GenerationJob(
            engine.tokenize(prompt), max_tokens=400, temperature=0.0, min_output_tokens=400
        )
        first: list[Any] = []
        first_text = threading.Event()

        def first_sink(update: Any) -> None:
            first.append(update)
            if isinstance(update, TextPiece):
                first_text.set()

        future = engine.submit(long_job, first_sink)
        assert first_text.wait(120), "the first generation streamed nothing"
        # The second generation had no text when the worker died: it is run again.
        text, end = answer(engine, "Hello!")
        assert (text, end.finish_reason) == (reference, "stop")
        future.exception(timeout=60)
        assert isinstance(first[-1], GenerationEnd)
        assert first[-1].finish_reason == "crashed"
        assert engine.restarts == 1
        assert engine.fast_path.enabled is False
    finally:
        engine.close()


def test_forced_on_does_not_fall_back() -> None:
    with pytest.raises(WorkerCrashed) as caught:
        Engine(
            MODEL,
            "tinychat",
            n_ctx=512,
            n_threads=1,
            extra_bufts="on",
            worker_target=crash_while_loading,
        )
    assert caught.value.signal is signal.SIGSEGV


def test_forced_on_crash_during_a_request_ends_it_crashed() -> None:
    engine = Engine(
        MODEL, "tinychat", n_ctx=512, n_threads=1, extra_bufts="on", worker_target=crash_on_generate
    )
    try:
        _text, end = answer(engine, "Hello!")
        assert end.finish_reason == "crashed"
        assert engine.fast_path.enabled is True
    finally:
        engine.close()


def test_forced_off_never_uses_the_fast_path(reference: str) -> None:
    engine = Engine(
        MODEL,
        "tinychat",
        n_ctx=512,
        n_threads=1,
        extra_bufts="off",
        worker_target=crash_while_loading,
    )
    try:
        fast = engine.fast_path
        assert (fast.setting, fast.enabled) == ("off", False)
        assert fast.reason is not None and "--extra-bufts off" in fast.reason
        assert answer(engine, "Hello!")[0] == reference
        assert engine.restarts == 0
    finally:
        engine.close()


def test_setting_is_checked() -> None:
    with pytest.raises(ValueError):
        Engine(MODEL, "tinychat", extra_bufts="fast")  # type: ignore[arg-type]
    status = subprocess.run(
        [sys.executable, "-m", "napllm.lmsp_service", "--model", str(MODEL), "--extra-bufts", "x"],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO / "runtime")},
        timeout=60,
    )
    assert status.returncode == 2
    assert "--extra-bufts" in status.stderr


class _FaultOnHostileGrammar:
    """A worker's pipe end for a fast path that works, and a request that crashes llama.cpp anyway.

    The fast path is reported in use (the model itself is loaded without
    it, so this runs on every CPU); a generation whose grammar holds
    `HOSTILE_MARK` faults the process whether the fast path is on or off,
    the way a grammar or schema that trips a llama.cpp bug would.
    """

    def __init__(self, conn: Connection, fast: bool) -> None:
        self._conn = conn
        self._fast = fast

    def recv(self) -> Any:
        message = self._conn.recv()
        if message[0] == "generate" and HOSTILE_MARK in str(message[2].get("grammar")):
            segfault()
        return message

    def send(self, message: Any) -> None:
        if message[0] == "ready":
            message = ("ready", {**message[1], "extra_bufts": self._fast})
        self._conn.send(message)


HOSTILE_MARK = "hostile-crash"


def crash_on_hostile_grammar(
    conn: Connection,
    model_path: str,
    n_ctx: int,
    n_threads: int | None,
    extra_bufts: bool = True,
    slots: int = DEFAULT_SLOTS,
) -> None:
    """`worker_main`, except that a generation with a marked grammar faults in either mode."""
    wrapped = _FaultOnHostileGrammar(conn, extra_bufts)
    worker_main(wrapped, model_path, n_ctx, n_threads, False, slots)  # type: ignore[arg-type]


def test_a_request_that_crashes_llama_cpp_does_not_turn_the_fast_path_off_for_good(
    reference: str,
) -> None:
    """One hostile request must not cost every later request the CPU fast path.

    The fast path passed the self-check; a request that crashes the worker
    with and without it is the request's fault, not the CPU's.
    """
    engine = Engine(
        MODEL, "tinychat", n_ctx=512, n_threads=1, worker_target=crash_on_hostile_grammar
    )
    try:
        assert engine.fast_path.enabled is True
        prompt = engine.render([{"role": "user", "content": "Hello!"}], None)
        job = GenerationJob(
            engine.tokenize(prompt),
            max_tokens=8,
            temperature=0.0,
            grammar=f'root ::= "{HOSTILE_MARK}"',
        )
        ends: list[GenerationEnd] = []
        done = threading.Event()

        def sink(update: Any) -> None:
            if isinstance(update, GenerationEnd):
                ends.append(update)
                done.set()

        engine.submit(job, sink)
        assert done.wait(120), "the hostile generation did not end"
        assert [e.finish_reason for e in ends] == ["crashed"]
        text, end = answer(engine, "Hello!")
        assert (text, end.finish_reason) == (reference, "stop")
        assert engine.fast_path.enabled is True, engine.fast_path.reason
    finally:
        engine.close()


def crash_on_generate_then_hang(
    conn: Connection,
    model_path: str,
    n_ctx: int,
    n_threads: int | None,
    extra_bufts: bool = True,
    slots: int = DEFAULT_SLOTS,
) -> None:
    """`crash_on_generate` first; every later worker hangs while loading (never ready)."""
    marker = Path(os.environ[MARKER_ENV])
    if marker.exists():
        time.sleep(60)
        return
    marker.write_text("faulted", encoding="utf-8")
    crash_on_generate(conn, model_path, n_ctx, n_threads, extra_bufts, slots)


def test_close_during_a_restart_ends_the_waiting_generation_and_leaves_no_worker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Before, close() returned while the restart still waited (up to
    # START_TIMEOUT_S) for a worker that never became ready: the generation
    # held for a rerun never ended and the starting worker outlived close().
    monkeypatch.setenv(MARKER_ENV, str(tmp_path / "faulted"))
    engine = Engine(
        MODEL, "tinychat", n_ctx=512, n_threads=1, worker_target=crash_on_generate_then_hang
    )
    ends: list[GenerationEnd] = []
    done = threading.Event()

    def sink(update: Any) -> None:
        if isinstance(update, GenerationEnd):
            ends.append(update)
            done.set()

    prompt = engine.render([{"role": "user", "content": "Hello!"}], None)
    engine.submit(GenerationJob(engine.tokenize(prompt), max_tokens=8, temperature=0.0), sink)
    deadline = time.monotonic() + 60
    while engine._worker._process is not None:  # the first worker crashed and was reaped
        assert time.monotonic() < deadline, "the worker did not crash"
        time.sleep(0.05)
    time.sleep(1.0)  # the restart is waiting for the hanging worker
    started = time.monotonic()
    engine.close()
    assert time.monotonic() - started < 8
    assert done.wait(5), "the generation held for a rerun never ended"
    assert len(ends) == 1
    assert not [p for p in multiprocessing.active_children() if p.name == "napllm-lmsp-model"]
