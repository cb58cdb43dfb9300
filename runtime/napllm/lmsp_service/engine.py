"""LMSP service generation in a supervised model worker process (LMSP 1.0, 6.1, 6.5).

Rules
- One GGUF model per service. llama.cpp runs only in a model worker
  process (worker.py, started with `multiprocessing`'s `spawn` method) that
  owns the `Llama` object; `Engine` lives in the service process and talks
  to it over a pipe. The service process never calls into llama.cpp, so a
  crash inside it (a segmentation fault on a hostile grammar, an abort, an
  out-of-memory kill) ends the worker only.
- Continuous batching: the worker decodes up to `slots` generations
  together (worker.py), each in its own KV-cache sequence of `n_ctx`
  tokens. Jobs queue in the service process (in arrival order) and are
  handed to the worker as soon as it has a free slot, so a job that
  arrives while others run joins their batch at the next decoding step;
  beyond `slots` it waits here.
- Supervision: when the worker dies, the generations it held end with
  `finish_reason` `crashed` (the service answers a typed 5xx problem),
  waiting tokenizations raise `EngineCrashed`, and a new worker is started
  (the model is loaded again) before the queued generations go on. Only
  the generations that were in the worker when it died fail (but see "Any
  CPU" for the first crash of the fast path).
- Prompts are rendered outside the model worker with the GGUF's own chat
  template (`tokenizer.chat_template`, reported by the worker, `template`)
  through llama-cpp-python's sandboxed Jinja formatter (prompt.py; the
  service does it in a schema worker under a time limit), in the OpenAI chat shape the
  template expects: input `message` items become `{"role", "content"}`,
  `function_call` items become an assistant message with `tool_calls`,
  `function_call_output` items become `{"role": "tool", "tool_call_id",
  "content"}`, and the tool definitions are passed as `tools`. A template
  that does not mention tools leaves them out.
- Structured output and forced tool calls are constrained by GBNF text built
  by grammar.py (bounded); the grammar is not trusted (llama.cpp has run
  unconstrained on grammar errors): the caller checks the output afterwards.
- Any CPU: the worker decodes a short prompt before it reports ready
  (`llama_load.self_check`). With `extra_bufts="auto"` (the default), a
  worker that dies by a crash signal (`llama_load.CRASH_SIGNALS`) while
  llama.cpp's CPU extra buffer types are on, during that check, is
  restarted with them off, once for the life of the engine; this is
  logged once and reported by `fast_path`. A worker that dies in a
  generation is restarted with the same setting first: only when that
  worker's self-check crashes too is the fast path blamed (then turned
  off, and the generations of the crashed batch that had produced no text
  run again on the next worker, first in the queue and in their order, so
  their clients get their answers). When the self-check passes, the
  requests were at fault: they end `crashed`, are never run again, and the
  fast path stays on. Generations that had already streamed text end
  `crashed` either way. `"on"` and `"off"` force the setting (no fallback).
- Cancellation (`CancelFlag.set`) removes a queued job or tells the worker
  to stop the generation, inside the running decoding step if need be
  (llama.cpp's abort callback, worker.py), which frees its slot at once
  and keeps the worker. A worker still running a cancelled generation
  `cancel_grace_s` later (stuck inside llama.cpp, e.g. in a grammar's
  sampling) is killed and restarted, so a stuck generation cannot hold the
  model for ever; the generation then ends `cancelled` (the others in the
  worker end `crashed`).
- Time limit: every generation may hold its slot in the worker for
  `time_limit_s` seconds (`GenerationJob.time_limit_s`, by default the
  engine's `generation_time_limit_s`); the worker ends it `time` at the
  limit, inside a decoding step if need be, keeping the text produced so
  far. A worker still running it `cancel_grace_s` after the limit is
  killed and restarted as for a cancellation; the generation then ends
  `time` as well.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import multiprocessing
import signal
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, Literal

from ..lmsp import FunctionCallIn, FunctionCallOutputIn, FunctionTool, InputImage, MessageItemIn
from .llama_load import ExtraBufts, crash_signal
from .prompt import ChatTemplate, TemplateError, render_prompt  # noqa: F401 (re-exported)
from .tasks import CancelFlag
from .worker import DEFAULT_SLOTS, worker_main

log = logging.getLogger("napllm.lmsp_service.engine")

DEFAULT_TEMPERATURE = 0.8
#: Seconds a cancelled generation may go on before its worker is killed.
CANCEL_GRACE_S = 10.0
#: Seconds a generation may hold a slot of the worker (`--generation-time-limit-seconds`).
GENERATION_TIME_LIMIT_S = 600.0
#: Seconds to wait for a (re)started worker to load the model.
START_TIMEOUT_S = 120.0

FinishReason = Literal["stop", "length", "cancelled", "time", "error", "crashed"]


class EngineCrashed(Exception):
    """The model worker died (or is restarting) while this request needed it."""


class WorkerCrashed(ValueError):
    """A starting model worker died by a crash signal (`signal`) before it was ready."""

    def __init__(self, message: str, sig: signal.Signals) -> None:
        super().__init__(message)
        self.signal = sig


@dataclass(frozen=True)
class FastPath:
    """What the engine says about llama.cpp's CPU fast path (`/models` extension).

    `setting`: `auto`, `on` or `off` (`--extra-bufts`); `enabled`: whether
    the running worker uses the CPU extra buffer types; `reason`: why they
    are off, in words for a user (`None` while they are on); `cpu`:
    llama.cpp's summary of the CPU features it found.
    """

    setting: ExtraBufts
    enabled: bool
    reason: str | None
    cpu: str

    def as_json(self) -> dict[str, Any]:
        """The JSON object of the `/models` entry's `cpu_fast_path` extension."""
        return {
            "setting": self.setting,
            "enabled": self.enabled,
            "reason": self.reason,
            "cpu": self.cpu,
        }


@dataclass
class GenerationJob:
    """One generation: prompt token ids, limits and sampling settings.

    `max_tokens`: output limit in tokens (`None`: the room left in the
    context); `temperature`: 0 is greedy; `grammar`: optional GBNF text;
    `min_output_tokens`: end-of-generation tokens are forbidden until this
    many tokens were produced; `cancel`: set to stop it (also inside a
    decoding step); `time_limit_s`: seconds it may run once it has a slot
    in the worker (`None`: the engine's `generation_time_limit_s`); past
    it, it ends with `finish_reason` `time`.
    """

    prompt_tokens: list[int]
    max_tokens: int | None
    temperature: float
    grammar: str | None = None
    min_output_tokens: int = 0
    cancel: CancelFlag = field(default_factory=CancelFlag)
    time_limit_s: float | None = None


@dataclass
class TextPiece:
    """A piece of generated text (valid UTF-8, possibly several tokens)."""

    text: str


@dataclass
class GenerationEnd:
    """The end of a generation: why it stopped and how many tokens it produced."""

    finish_reason: FinishReason
    output_tokens: int


Update = TextPiece | GenerationEnd
Sink = Callable[[Update], None]


def chat_messages(items: Sequence[Any]) -> list[dict[str, Any]]:
    """Map LMSP input items (6.1, 6.5) to OpenAI-style chat messages for a template.

    `items` are `MessageItemIn`, `FunctionCallIn` and `FunctionCallOutputIn`
    records. Consecutive `function_call` items join one assistant message
    (after its text, if the assistant message came right before). Images
    must have been refused before (raises `ValueError` if one is present).
    """
    messages: list[dict[str, Any]] = []
    for item in items:
        if isinstance(item, MessageItemIn):
            texts: list[str] = []
            for part in item.content:
                if isinstance(part, InputImage):
                    raise ValueError("images are not supported by this model")
                texts.append(part.text)
            messages.append({"role": item.role, "content": "".join(texts)})
        elif isinstance(item, FunctionCallIn):
            call = {
                "id": item.call_id,
                "type": "function",
                "function": {"name": item.name, "arguments": item.arguments},
            }
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif isinstance(item, FunctionCallOutputIn):
            if item.images:
                raise ValueError("images are not supported by this model")
            messages.append({"role": "tool", "tool_call_id": item.call_id, "content": item.output})
        else:  # pragma: no cover - the request records admit no other item
            raise ValueError("unknown input item")
    return messages


def chat_tools(tools: Sequence[FunctionTool]) -> list[dict[str, Any]]:
    """LMSP function tools (6.5) in the OpenAI chat `tools` shape templates expect."""
    out = []
    for tool in tools:
        function: dict[str, Any] = {"name": tool.name, "parameters": tool.parameters}
        if tool.description is not None:
            function["description"] = tool.description
        out.append({"type": "function", "function": function})
    return out


@dataclass
class _Job:
    rid: int
    job: GenerationJob
    sink: Sink
    future: Future[None]
    ended: bool = False
    emitted: bool = False
    timed_out: bool = False  # killed because it ran past its time limit
    watchdog: threading.Timer | None = None  # kills a worker still running it past its limit


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
    own `time_limit_s` wins); `extra_bufts`: `auto`, `on` or `off` for llama.cpp's CPU extra buffer
    types (module rules); `worker_target`: the worker process's entry point
    (`worker_main`, called as `(conn, model_path, n_ctx, n_threads,
    extra_bufts, slots)`; tests give a wrapper of it that really crashes).
    Starting blocks until the worker has loaded and checked the model;
    raises `ValueError` when it cannot (unloadable file, no chat template,
    the worker died, or `START_TIMEOUT_S` passed). `restarts` counts the
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
    ) -> None:
        if extra_bufts not in ("auto", "on", "off"):
            raise ValueError("extra_bufts must be auto, on or off")
        self.model_id = model_id
        self._extra_bufts_setting: ExtraBufts = extra_bufts
        self._extra_bufts = extra_bufts != "off"
        self._fast_path_reason: str | None = (
            "turned off by the service's --extra-bufts off option" if extra_bufts == "off" else None
        )
        self._worker_target = worker_target
        self._info: dict[str, Any] = {}
        self.restarts = 0
        self._model_path = str(model_path)
        self._n_ctx_arg = n_ctx if n_ctx is not None else 0  # 0: the trained context
        self._n_threads = n_threads
        self._slots_arg = slots
        self.cancel_grace_s = cancel_grace_s
        self.generation_time_limit_s = generation_time_limit_s
        self._mp = multiprocessing.get_context("spawn")
        self._lock = threading.Lock()  # guards the job queue, running jobs and waiters
        self._send_lock = threading.Lock()
        self._ids = itertools.count(1)
        self._queue: deque[_Job] = deque()
        self._running: dict[int, _Job] = {}  # by request number, in the worker
        self._token_waiters: dict[int, Future[list[int]]] = {}
        self._ready = threading.Event()
        self._closed = False
        self._process: Any = None
        self._conn: Connection | None = None
        try:
            info = self._spawn()
        except WorkerCrashed as exc:
            if not self._fall_back(exc.signal, "while it loaded and checked the model"):
                raise
            info = self._spawn()
        self.n_ctx: int = int(info["n_ctx"])
        self.slots: int = int(info["slots"])
        self.chat_template: str = str(info["chat_template"])
        #: UTF-8 bytes of a rendered prompt beyond which it cannot fit in `n_ctx`
        #: tokens (every token covers at most the vocabulary's longest token text).
        self.max_prompt_bytes: int = self.n_ctx * int(info["max_token_bytes"])
        self.template = ChatTemplate(
            self.chat_template, str(info["bos_text"]), str(info["eos_text"])
        )
        self._ready.set()
        self._reader = threading.Thread(target=self._read_loop, name="lmsp-worker", daemon=True)
        self._reader.start()

    # -- capabilities ---------------------------------------------------------

    @property
    def fast_path(self) -> FastPath:
        """The state of llama.cpp's CPU fast path (extra buffer types) right now."""
        with self._lock:
            info = self._info
            return FastPath(
                setting=self._extra_bufts_setting,
                enabled=bool(info.get("extra_bufts", self._extra_bufts)),
                reason=self._fast_path_reason,
                cpu=str(info.get("cpu_features", "")).strip(),
            )

    @property
    def supports_tools(self) -> bool:
        """Whether the chat template can render tool calls (and so tool use)."""
        return "tool_calls" in self.chat_template or "tools" in self.chat_template

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
        if not self._ready.wait(timeout_s):
            raise EngineCrashed("the model worker is not ready")
        rid = next(self._ids)
        waiter: Future[list[int]] = Future()
        with self._lock:
            self._token_waiters[rid] = waiter
        try:
            self._send(("tokenize", rid, prompt))
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
        worker died during it, `time` past its time limit). The returned future resolves at the end
        (with `EngineCrashed` after a crash).
        """
        entry = _Job(next(self._ids), job, sink, Future())
        with self._lock:
            self._queue.append(entry)
        job.cancel.on_set(lambda: self._cancel(entry))
        self._dispatch()
        return entry.future

    def close(self) -> None:
        """Stop the worker (after its running generation, at most 5 s) and end queued jobs."""
        self._closed = True
        self._end_queued()
        with contextlib.suppress(OSError):
            self._send(("stop",))
        process = self._process
        if process is not None:
            process.join(5)
            if process.is_alive():
                process.kill()
                process.join(5)
        if self._conn is not None:
            self._conn.close()

    # -- supervision --------------------------------------------------------------

    def _end_queued(self) -> None:
        """End every queued job `cancelled` (the engine is closing)."""
        with self._lock:
            queued = list(self._queue)
            self._queue.clear()
        for entry in queued:
            self._end(entry, GenerationEnd("cancelled", 0))

    def _fall_back(self, sig: signal.Signals, when: str) -> bool:
        """Turn the CPU extra buffer types off after a crash, if the setting allows it.

        Returns whether the next worker will start with them off (only in
        `auto` mode, and only the first time). Logged once.
        """
        if self._extra_bufts_setting != "auto" or not self._extra_bufts:
            return False
        self._extra_bufts = False
        reason = (
            f"the model worker crashed ({sig.name}) {when} with llama.cpp's CPU fast path "
            "(extra buffer types such as AMX or repacked weights) on; it runs without it now "
            "(same answers, somewhat slower; --extra-bufts on forces it)"
        )
        self._fast_path_reason = reason
        log.warning("%s", reason)
        return True

    def _spawn(self) -> dict[str, Any]:
        """Start a worker and wait for its `ready` message.

        Raises `WorkerCrashed` (a `ValueError`) when the worker died by a
        crash signal before it was ready, `ValueError` for other failures.
        """
        parent, child = self._mp.Pipe(duplex=True)
        process = self._mp.Process(
            target=self._worker_target,
            args=(
                child,
                self._model_path,
                self._n_ctx_arg,
                self._n_threads,
                self._extra_bufts,
                self._slots_arg,
            ),
            name="napllm-lmsp-model",
            daemon=True,
        )
        process.start()
        child.close()
        try:
            if not parent.poll(START_TIMEOUT_S):
                raise ValueError("the model worker did not start in time")
            message = parent.recv()
        except (EOFError, OSError) as exc:
            process.join(5)
            parent.close()
            sig = crash_signal(process.exitcode)
            if sig is not None:
                raise WorkerCrashed(
                    f"the model worker crashed ({sig.name}) while loading the model", sig
                ) from exc
            raise ValueError("the model worker exited while loading the model") from exc
        except ValueError:
            process.kill()
            parent.close()
            raise
        if message[0] != "ready":
            process.join(5)
            parent.close()
            raise ValueError(str(message[1]))
        info = dict(message[1])
        with self._lock:
            self._info = info
        self._process = process
        self._conn = parent
        return info

    def _send(self, message: tuple[Any, ...]) -> None:
        with self._send_lock:
            if self._conn is None:
                raise OSError("no model worker")
            self._conn.send(message)

    def _read_loop(self) -> None:
        while True:
            conn = self._conn
            try:
                assert conn is not None
                message = conn.recv()
            except (EOFError, OSError, AssertionError):
                if self._closed:
                    return
                self._on_crash()
                if self._closed:
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
            return
        if kind != "updates":
            return
        ended = False
        for update in message[1]:
            with self._lock:
                entry = self._running.get(update[1])
                if entry is not None and update[0] == "end":
                    del self._running[update[1]]
            if entry is None:
                continue  # a late update of a job that already ended
            if update[0] == "text":
                entry.emitted = True
                entry.sink(TextPiece(str(update[2])))
            elif update[0] == "end":
                self._end(entry, GenerationEnd(update[2], int(update[3])))
                ended = True
        if ended:
            self._dispatch()

    def _on_crash(self) -> None:
        """The worker died: fail what it held, start a new one, go on with the queue."""
        with self._lock:  # together, so _dispatch cannot hand a job to the dead worker
            self._ready.clear()
            running, self._running = list(self._running.values()), {}
            waiters = list(self._token_waiters.values())
        process = self._process
        code = None
        if process is not None:
            process.join(5)
            code = process.exitcode
        log.error("the model worker died (exit status %s); restarting it", code)
        # A crash in a generation with the fast path on is evidence against
        # the fast path only if the restarted worker, fast path still on,
        # fails its self-check too; otherwise a request was at fault (a
        # grammar or input that trips llama.cpp) and must neither cost every
        # later request the fast path nor run again. The suspects are the
        # generations of the crashed batch that had streamed no text (in
        # their order); the others fail now.
        fast_path_on = (
            crash_signal(code) is not None
            and self._extra_bufts_setting == "auto"
            and self._extra_bufts
        )
        suspects = [
            entry
            for entry in running
            if fast_path_on and not entry.emitted and not entry.job.cancel.is_set()
        ]
        failed = [entry for entry in running if entry not in suspects]
        with self._send_lock:
            if self._conn is not None:
                self._conn.close()
            self._conn = None
            self._process = None
        for waiter in waiters:
            if not waiter.done():
                waiter.set_exception(EngineCrashed("the model worker died"))
        for entry in failed:
            if entry.timed_out:  # killed for running past its limit: it ended at the limit
                self._end(entry, GenerationEnd("time", 0))
            else:
                self._end(entry, GenerationEnd("crashed", 0), EngineCrashed("the worker died"))
        when = (
            "during a generation and again in the restarted worker's self-check"
            if suspects
            else "while it restarted"
        )
        delay = 1.0
        while not self._closed:
            try:
                self._spawn()
                break
            except WorkerCrashed as exc:
                if self._fall_back(exc.signal, when):
                    continue
                log.exception("could not restart the model worker; retrying")
                time.sleep(delay)
                delay = min(delay * 2, 30.0)
            except ValueError:
                log.exception("could not restart the model worker; retrying")
                time.sleep(delay)
                delay = min(delay * 2, 30.0)
        if suspects:
            if self._extra_bufts or self._closed:
                # The fast path passed its self-check again: the requests are at fault.
                for entry in suspects:
                    self._end(entry, GenerationEnd("crashed", 0), EngineCrashed("the worker died"))
            else:
                with self._lock:  # the fast path was at fault: answer them without it
                    self._queue.extendleft(reversed(suspects))
        if self._closed:
            self._end_queued()
            process = self._process
            if process is not None and process.is_alive():  # started while close() ran
                process.kill()
            return
        self.restarts += 1
        with self._lock:
            self._ready.set()
        self._dispatch()

    def _dispatch(self) -> None:
        """Hand queued jobs to the worker while it has free slots."""
        while True:
            with self._lock:
                if len(self._running) >= self.slots or not self._ready.is_set() or not self._queue:
                    return
                entry = self._queue.popleft()
                if entry.job.cancel.is_set():
                    cancelled = True
                else:
                    cancelled = False
                    self._running[entry.rid] = entry
            if cancelled:
                self._end(entry, GenerationEnd("cancelled", 0))
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
            }
            watchdog = threading.Timer(limit + self.cancel_grace_s, self._enforce_limit, (entry,))
            watchdog.daemon = True
            entry.watchdog = watchdog
            watchdog.start()
            try:
                self._send(("generate", entry.rid, payload))
            except OSError:
                return  # the reader notices the dead worker and ends this job

    def _cancel(self, entry: _Job) -> None:
        with self._lock:
            queued = entry in self._queue
            if queued:
                self._queue.remove(entry)
            running = self._running.get(entry.rid) is entry
        if queued:
            self._end(entry, GenerationEnd("cancelled", 0))
        elif running:
            with contextlib.suppress(OSError):
                self._send(("cancel", entry.rid))
            watchdog = threading.Timer(self.cancel_grace_s, self._enforce_cancel, (entry,))
            watchdog.daemon = True
            watchdog.start()

    def _enforce_cancel(self, entry: _Job) -> None:
        """Kill a worker that still runs `entry` `cancel_grace_s` after its cancellation.

        Cancellation is checked between tokens; a worker stuck inside
        llama.cpp never gets there. It is treated like a crash (restart).
        """
        with self._lock:
            stuck = self._running.get(entry.rid) is entry
            process = self._process
        if stuck and process is not None:
            log.error("the model worker ignored a cancellation; stopping it")
            process.kill()

    def _enforce_limit(self, entry: _Job) -> None:
        """Kill a worker that still runs `entry` `cancel_grace_s` after its time limit.

        The worker ends a generation at its limit, inside a decoding step
        too; one still running here is stuck in llama.cpp (restart as after
        a crash; the generation ends `time`).
        """
        with self._lock:
            stuck = self._running.get(entry.rid) is entry
            process = self._process
            if stuck:
                entry.timed_out = True
        if stuck and process is not None:
            log.error("the model worker ignored a generation's time limit; stopping it")
            process.kill()

    @staticmethod
    def _end(entry: _Job, end: GenerationEnd, error: Exception | None = None) -> None:
        if entry.ended:
            return
        entry.ended = True
        if entry.watchdog is not None:
            entry.watchdog.cancel()
        entry.sink(end)
        if error is None:
            entry.future.set_result(None)
        else:
            entry.future.set_exception(error)
