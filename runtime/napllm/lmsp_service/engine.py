"""LMSP service generation in a supervised model worker process (LMSP 1.0, 6.1, 6.5).

Rules
- One GGUF model per service. `Engine` lives in the service process and
  joins the parts: the model worker process that owns llama.cpp
  (worker_process.py starts it and holds its pipe; worker.py is its side),
  the queue of generations and their hand-off to the worker
  (scheduler.py: continuous batching, cancellation, time limits), and the
  chat template the worker reports, for prompt.py to render with.
- Supervision: when the worker dies, the generations it held end with
  `finish_reason` `crashed` (the service answers a typed 5xx problem),
  waiting tokenizations raise `EngineCrashed`, and a new worker is started
  (the model is loaded again) before the queued generations go on. Only
  the generations that were in the worker when it died fail (but see "Any
  CPU" for the first crash of the fast path). A generation whose worker
  was killed because it ran past its time limit ends `time` instead.
- Any CPU: the worker decodes a short prompt before it reports ready
  (`batch_load.self_check`). With `extra_bufts="auto"` (the default), a
  worker that dies by a crash signal (`llama_load.CRASH_SIGNALS`) while
  llama.cpp's CPU extra buffer types are on, during that check, is
  restarted with them off, once for the life of the engine
  (`worker_process.WorkerProcess.fall_back`). A worker that dies in a
  generation is restarted with the same setting first: only when that
  worker's self-check crashes too is the fast path blamed (then turned
  off, and the generations of the crashed batch that had produced no text
  run again on the next worker, first in the queue and in their order, so
  their clients get their answers). When the self-check passes, the
  requests were at fault: they end `crashed`, are never run again, and the
  fast path stays on. Generations that had already streamed text end
  `crashed` either way. `"on"` and `"off"` force the setting (no fallback).
"""

from __future__ import annotations

import itertools
import logging
import threading
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from .jobs import (
    DEFAULT_TEMPERATURE,
    EngineCrashed,
    FinishReason,
    GenerationEnd,
    GenerationJob,
    Sink,
    TextPiece,
    Update,
)
from .llama_load import ExtraBufts
from .prompt import ChatTemplate, render_prompt
from .scheduler import (
    CANCEL_GRACE_S,
    GENERATION_TIME_LIMIT_S,
    JobState,
    ScheduledJob,
    Scheduler,
)
from .worker import DEFAULT_SLOTS, worker_main
from .worker_process import FastPath, WorkerCrashed, WorkerProcess

#: What callers import from here: the engine and the types of its interface.
__all__ = [
    "CANCEL_GRACE_S",
    "DEFAULT_TEMPERATURE",
    "GENERATION_TIME_LIMIT_S",
    "Engine",
    "EngineCrashed",
    "FastPath",
    "FinishReason",
    "GenerationEnd",
    "GenerationJob",
    "Sink",
    "TextPiece",
    "Update",
    "WorkerCrashed",
]

log = logging.getLogger("napllm.lmsp_service.engine")


class Engine:
    """The supervisor of the model worker process, in the service process.

    `model_path`: a GGUF file; `model_id`: the id clients use (LMSP `model`);
    `n_ctx`: context window of one generation in tokens (default: the
    model's trained context); `slots`: generations decoded together (the KV
    cache holds `slots` * `n_ctx` tokens); `n_threads`: CPU threads for
    llama.cpp, for single tokens and for batches alike (default:
    `llama_load.default_threads`); `cancel_grace_s`: seconds a cancelled
    generation (or one past its time limit) may keep running before the
    worker is killed and restarted; `generation_time_limit_s`: seconds a
    generation may hold a slot (default `GENERATION_TIME_LIMIT_S`; a job's
    own `time_limit_s` wins); `extra_bufts`: `auto`, `on` or `off` for
    llama.cpp's CPU extra buffer types (module rules); `worker_target`: the
    worker process's entry point (`worker_main`, called as `(conn,
    model_path, n_ctx, n_threads, extra_bufts, slots)`; tests give a
    wrapper of it that really crashes); `prompt_reuse`: whether a
    generation may reuse the KV state a finished one left for the same
    leading prompt tokens (prompt_cache.py; `GenerationEnd.cached_tokens`
    counts them). Starting blocks until the worker
    has loaded and checked the model; raises `ValueError` when it cannot
    (unloadable file, no chat template, the worker died, or
    `worker_process.START_TIMEOUT_S` passed). `restarts` counts the
    workers started after a crash.
    """

    def __init__(
        self,
        model_path: Path,
        model_id: str,
        n_ctx: int | None = None,
        n_threads: int | None = None,
        cancel_grace_s: float = CANCEL_GRACE_S,
        extra_bufts: ExtraBufts = "auto",
        worker_target: Callable[..., None] = worker_main,
        slots: int = DEFAULT_SLOTS,
        generation_time_limit_s: float = GENERATION_TIME_LIMIT_S,
        prompt_reuse: bool = True,
    ) -> None:
        self.model_id = model_id
        self.restarts = 0
        self._worker = WorkerProcess(
            worker_target,
            str(model_path),
            n_ctx if n_ctx is not None else 0,  # 0: the trained context
            n_threads,
            slots,
            extra_bufts,
        )
        self._ids = itertools.count(1)
        self._lock = threading.Lock()  # guards the tokenization waiters
        self._token_waiters: dict[int, Future[list[int]]] = {}
        info = self._worker.start()
        self.n_ctx: int = int(info["n_ctx"])
        self.chat_template: str = str(info["chat_template"])
        #: UTF-8 bytes of a rendered prompt beyond which it cannot fit in `n_ctx`
        #: tokens (every token covers at most the vocabulary's longest token text).
        self.max_prompt_bytes: int = self.n_ctx * int(info["max_token_bytes"])
        self.template = ChatTemplate(
            self.chat_template,
            str(info["bos_text"]),
            str(info["eos_text"]),
            add_bos=bool(info.get("add_bos")),
            add_eos=bool(info.get("add_eos")),
        )
        self._jobs = Scheduler(
            self._ids,
            self._worker.send,
            self._worker.kill,
            int(info["slots"]),
            cancel_grace_s,
            generation_time_limit_s,
            prompt_reuse,
        )
        self._jobs.resume()
        self._reader = threading.Thread(target=self._read_loop, name="lmsp-worker", daemon=True)
        self._reader.start()

    # -- capabilities ---------------------------------------------------------

    @property
    def slots(self) -> int:
        """Generations the worker decodes together."""
        return self._jobs.slots

    @property
    def fast_path(self) -> FastPath:
        """The state of llama.cpp's CPU fast path (extra buffer types) right now."""
        return self._worker.fast_path

    @property
    def supports_tools(self) -> bool:
        """Whether the chat template can render tool calls (and so tool use)."""
        return "tool_calls" in self.chat_template or "tools" in self.chat_template

    @property
    def worker_pid(self) -> int | None:
        """The process id of the running model worker (`None` while it restarts)."""
        return self._worker.pid

    # -- prompt ---------------------------------------------------------------

    def render(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> str:
        """Render chat `messages` (and `tools`) with the model's template, in this process.

        Without a time limit: for tests and trusted callers (the service
        renders with `prompt.render_prompt` in a schema worker). Raises
        `TemplateError` when the template rejects the conversation.
        """
        return render_prompt(self.template, messages, tools)

    def tokenize(self, prompt: str, timeout_s: float = 60.0) -> list[int]:
        """Token ids of a rendered prompt (special tokens parsed, BOS per the model).

        Blocking (call it off the event loop). Raises `EngineCrashed` when
        the worker died, is restarting past `timeout_s`, or failed.
        """
        if not self._jobs.ready.wait(timeout_s):
            raise EngineCrashed("the model worker is not ready")
        rid = next(self._ids)
        waiter: Future[list[int]] = Future()
        with self._lock:
            self._token_waiters[rid] = waiter
        try:
            self._worker.send(("tokenize", rid, prompt))
            return waiter.result(timeout=timeout_s)
        except (OSError, TimeoutError) as exc:
            raise EngineCrashed("the model worker did not answer") from exc
        finally:
            with self._lock:
                self._token_waiters.pop(rid, None)

    # -- generation -------------------------------------------------------------

    def submit(self, job: GenerationJob, sink: Sink) -> Future[None]:
        """Queue `job`; `sink` receives its updates (from a service thread).

        `sink` gets `TextPiece`s and then exactly one `GenerationEnd`
        (`finish_reason` `error` when llama.cpp failed, `crashed` when the
        worker died during it, `time` past its time limit). The returned
        future resolves at the end (with `EngineCrashed` after a crash).
        """
        return self._jobs.submit(job, sink)

    def close(self) -> None:
        """End queued jobs `cancelled`, stop the worker, and end every job it left running.

        The worker finishes its running generations (at most
        `WorkerProcess.stop_wait_s`, then it is killed); what it sent before
        it ended is read, and a generation it did not end (it was killed)
        ends `cancelled`, as the queued ones; a job submitted later ends
        `cancelled` at once. Every job ends exactly once.
        """
        self._worker.closed = True
        self._jobs.end_queued()
        self._worker.stop()
        self._reader.join(5)  # it returns at the pipe's end, after the last message
        self._worker.reap()
        with self._lock:
            waiters = list(self._token_waiters.values())
        for waiter in waiters:
            if not waiter.done():
                waiter.set_exception(EngineCrashed("the engine closed"))
        for entry in self._jobs.pause():
            Scheduler.end(entry, GenerationEnd("cancelled", 0))

    # -- supervision --------------------------------------------------------------

    def _read_loop(self) -> None:
        while True:
            try:
                message = self._worker.recv()
            except (EOFError, OSError):
                if self._worker.closed:
                    return
                self._on_crash()
                if self._worker.closed:
                    return
                continue
            self._on_message(message)

    def _on_message(self, message: tuple[Any, ...]) -> None:
        kind = message[0]
        if kind == "tokens":
            _, rid, ids = message
            with self._lock:
                waiter = self._token_waiters.get(rid)
            if waiter is not None and not waiter.done():
                if ids is None:
                    waiter.set_exception(EngineCrashed("tokenization failed"))
                else:
                    waiter.set_result(list(ids))
        elif kind == "updates":
            self._jobs.on_updates(message[1])

    def _on_crash(self) -> None:
        """The worker died: fail what it held, start a new one, go on with the queue."""
        running = self._jobs.pause()  # first, so no job is handed to the dead worker
        with self._lock:
            waiters = list(self._token_waiters.values())
        code = self._worker.reap()
        log.error("the model worker died (exit status %s); restarting it", code)
        # A crash in a generation with the fast path on is evidence against
        # the fast path only if the restarted worker, fast path still on,
        # fails its self-check too; otherwise a request was at fault (a
        # grammar or input that trips llama.cpp) and must neither cost every
        # later request the fast path nor run again. The suspects are the
        # generations of the crashed batch that had streamed no text (in
        # their order); the others fail now.
        fast_path_on = self._worker.fast_path_suspect(code)
        suspects = [
            entry
            for entry in running
            if fast_path_on
            and entry.state is JobState.RUNNING  # no text yet
            and not entry.job.cancel.is_set()
        ]
        failed = [entry for entry in running if entry not in suspects]
        for waiter in waiters:
            if not waiter.done():
                waiter.set_exception(EngineCrashed("the model worker died"))
        for entry in failed:
            if entry.state is JobState.OVERTIME:  # killed past its limit: it ended there
                Scheduler.end(entry, GenerationEnd("time", 0))
            else:
                _crashed(entry)
        self._worker.restart(
            "during a generation and again in the restarted worker's self-check"
            if suspects
            else "while it restarted"
        )
        if suspects:
            if self._worker.extra_bufts or self._worker.closed:
                # The fast path passed its self-check again: the requests are at fault.
                for entry in suspects:
                    _crashed(entry)
            else:  # the fast path was at fault: answer them without it
                self._jobs.requeue_first(suspects)
        if self._worker.closed:
            self._jobs.end_queued()
            self._worker.kill()  # started while close() ran
            self._worker.reap()
            return
        self.restarts += 1
        self._jobs.resume()


def _crashed(entry: ScheduledJob) -> None:
    """End `entry` `crashed`, its future with `EngineCrashed`."""
    Scheduler.end(entry, GenerationEnd("crashed", 0), EngineCrashed("the worker died"))
