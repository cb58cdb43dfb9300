"""The model worker process: the only place llama.cpp runs (docs/lmsp.md, "Crash isolation").

`worker_main` is the target of a `multiprocessing` process started with the
`spawn` method by `engine.Engine`. It loads the GGUF model, then serves
messages from the service over one duplex pipe (`multiprocessing.Pipe`):

Service -> worker (tuples; `rid` is the service's request number):
- `("tokenize", rid, prompt)`: token ids of a rendered prompt.
- `("generate", rid, job)`: start one generation; `job` is a dict with
  `prompt_tokens`, `max_tokens` (`None`: no limit), `temperature`,
  `grammar` (GBNF text or `None`), `min_output_tokens` and `time_limit_s`
  (seconds the generation may hold its sequence, from the moment it takes
  it; `None`: no limit). The service never has more than `slots`
  generations in the worker at once.
- `("cancel", rid)`: stop that generation at once, inside a decoding step
  if it is in one.
- `("stop",)`: exit once the running generations have ended.

Worker -> service:
- `("ready", info)` once, after loading and the self-check (`info`:
  `n_ctx` (the context of one sequence), `slots`, `chat_template`,
  `bos_text`, `eos_text`, `extra_bufts` (whether llama.cpp's CPU extra
  buffer types are in use), `cpu_features`, `max_token_bytes` (the
  longest text of one token, special tokens included: a prompt of more
  UTF-8 bytes than `n_ctx` times this cannot fit, whatever its tokens)),
  or `("failed", reason)` and exit.
- `("tokens", rid, ids)` (`ids` is `None` when tokenization failed).
- `("updates", [update, ...])`: what one decoding step produced for the
  running generations, in order; an update is `("text", rid, text)`
  (generated text, several tokens joined when they come faster than
  `FLUSH_INTERVAL_S`) or `("end", rid, finish_reason, output_tokens)` with
  `finish_reason` `stop`, `length`, `cancelled`, `time` (its
  `time_limit_s` ran out) or `error`.

Before it reports `ready`, the worker decodes a short prompt as one batch
and then one more token (`llama_load.self_check_context`): a CPU fast path
that crashes kills the worker here, before any request, and the supervisor
decides what to do (engine.py, "Any CPU"). The model parameters come from
`llama_load.load_model`, the one place that decides them.

Continuous batching (the generation loop, `BatchRunner`)
- The context holds `slots` sequences, each with its own part of the KV
  cache (`n_ctx` tokens, not shared: a long request cannot take another's
  room). Every generation gets a free sequence when it arrives and joins
  the running batch at the next step: one `llama_decode` per step holds
  the next token of every generating sequence and, in the room left (up to
  `N_BATCH` tokens), the prompt tokens of the sequences still reading
  their prompt (in arrival order, long prompts spread over steps).
- Each generation has its own sampler chain (greedy at temperature 0, else
  llama-cpp-python's default chain: top-k 40, typical 1.0, top-p 0.95,
  min-p 0.05, temperature, seeded draw), its own grammar, output limit,
  minimum output (end-of-generation tokens are masked in its logits until
  then) and cancellation flag. An ending generation (stop, limit,
  cancellation, error) clears its sequence at once and the sequence takes
  the next generation.
- A grammar llama.cpp refuses ends that generation only (`error`); a
  failed `llama_decode` ends the generations of that step (`error`).
- Interrupting a step: a step holding a long prompt can take many seconds
  on a large model. llama.cpp calls the context's abort callback
  (`llama_set_abort_callback`) after every node of the compute graph;
  ours answers whether a generation of the running step was cancelled or
  is past its time limit. llama.cpp then stops the step and drops what the
  step had put into the KV cache (`llama_decode` returns 2); the runner
  rolls the step's sequences back to where they were before it (the
  positions beyond are cleared again, to be sure), the next step ends the
  cancelled or expired generations, and the others redo their part of the
  step. So a cancellation or time limit takes effect within one graph node,
  not one step, and the worker survives it. Sampling (a grammar's work per
  token) is not interruptible; it is bounded by the grammar limits, and
  the service kills a worker that still runs a generation well after its
  cancellation or time limit.
- Messages are read on a second thread (so cancellation does not wait for
  a step), prompts are tokenized on a third one (llama.cpp takes about a
  minute for 8 MiB of text on a slow machine: a cancellation must never
  wait behind that), and generation runs on the main thread.
- The worker exits when the service's end of the pipe closes: it never
  outlives the service.
- Anything llama.cpp does wrong here (a segmentation fault, an abort, an
  out-of-memory kill) ends this process only; the service notices the
  closed pipe, fails the generations that were in the worker and starts a
  new one.
- `output_tokens` counts sampled tokens without the end-of-generation token.

The loop is written against llama-cpp-python's low-level bindings
(`llama_batch`, `llama_decode`, `llama_sampler_*`, `llama_memory_*`)
because its `Llama` class decodes one sequence at a time.
"""

from __future__ import annotations

import codecs
import ctypes
import logging
import os
import queue
import random
import signal
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

from .llama_load import cpu_features, default_threads, extra_bufts_in_use, load_model
from .llama_load import self_check_context as _self_check_context

#: Seconds of generated text collected into one update at most.
FLUSH_INTERVAL_S = 0.005
#: Tokens one decoding step holds at most (the `llama_batch` size).
N_BATCH = 512
#: Sequences (concurrent generations) when the service does not say.
DEFAULT_SLOTS = 4
#: Sampler settings of llama-cpp-python's `create_completion`, kept so that
#: answers do not change with the batching loop.
TOP_K, TYPICAL_P, TOP_P, MIN_P = 40, 1.0, 0.95, 0.05


def context_params(n_ctx: int, slots: int, n_threads: int | None) -> Any:
    """llama.cpp context parameters: `slots` sequences of `n_ctx` tokens each.

    `n_threads`, when given, is used for every decoding step (single
    tokens and batches alike); by default (`llama_load.default_threads`) a
    step of one token uses half the cores this process may use, leaving a
    core to the HTTP process, and a larger step all of them.
    Returns a `llama_cpp.llama_context_params`.
    """
    import llama_cpp

    threads, batch_threads = default_threads()
    params = llama_cpp.llama_context_default_params()
    params.n_ctx = n_ctx * slots
    params.n_seq_max = slots
    params.kv_unified = False  # each sequence its own n_ctx cells
    params.n_batch = N_BATCH
    params.n_ubatch = N_BATCH
    params.n_threads = n_threads or threads
    params.n_threads_batch = n_threads or batch_threads
    params.no_perf = True
    return params


@dataclass
class LoadedModel:
    """A loaded model and its batching context (llama-cpp-python internals objects)."""

    model: Any  # llama_cpp._internals.LlamaModel
    context: Any  # llama_cpp._internals.LlamaContext
    n_ctx: int  # tokens per sequence
    slots: int


def load_batching_model(
    model_path: str, n_ctx: int, slots: int, n_threads: int | None, extra_bufts: bool
) -> LoadedModel:
    """Load the GGUF model (`llama_load.load_model`) and create its batching context.

    `n_ctx`: tokens per sequence (0: the model's trained context);
    `extra_bufts`: llama.cpp's CPU extra buffer types on or off
    (`llama_load.load_model`). Raises `ValueError` (or another exception
    of llama-cpp-python) on failure.
    """
    import llama_cpp
    from llama_cpp._internals import LlamaContext

    logging.getLogger("llama-cpp-python").setLevel(logging.ERROR)  # llama.cpp's own log
    model = load_model(model_path, extra_bufts=extra_bufts)
    per_sequence = n_ctx or model.n_ctx_train()
    context = LlamaContext(
        model=model, params=context_params(per_sequence, slots, n_threads), verbose=False
    )
    actual = int(llama_cpp.llama_n_ctx_seq(context.ctx))
    return LoadedModel(model, context, min(per_sequence, actual), slots)


def self_check(loaded: LoadedModel) -> None:
    """Decode a short prompt as one batch, then one more token, and clear the sequence.

    These are the two shapes a generation uses (a prompt, then single
    tokens), so a CPU code path that crashes llama.cpp does so here, before
    the first request (`llama_load.self_check_context`). Raises
    `RuntimeError` when llama.cpp reports a decode failure.
    """
    _self_check_context(loaded.model, loaded.context, min(loaded.n_ctx, N_BATCH))


def max_token_bytes(loaded: LoadedModel) -> int:
    """UTF-8 bytes of the longest token text of the vocabulary (special tokens as text).

    Every token of a tokenized prompt covers at most this many bytes of it,
    so a prompt of more than `n_ctx` times this many bytes cannot fit in a
    context of `n_ctx` tokens (the service refuses it without tokenizing).
    """
    import llama_cpp

    vocab = loaded.model.vocab
    buffer = ctypes.create_string_buffer(256)
    longest = 1
    for token in range(int(llama_cpp.llama_vocab_n_tokens(vocab))):
        size = llama_cpp.llama_token_to_piece(vocab, token, buffer, len(buffer), 0, True)
        longest = max(longest, -size if size < 0 else size)  # negative: the size it needs
    return longest


def worker_main(
    conn: Connection,
    model_path: str,
    n_ctx: int,
    n_threads: int | None,
    extra_bufts: bool = True,
    slots: int = DEFAULT_SLOTS,
) -> None:
    """Load the model, check it, and serve the pipe protocol of the module docstring.

    `n_ctx`: tokens per sequence (0: the model's trained context);
    `n_threads`: llama.cpp threads (`None`: `context_params`'s default);
    `extra_bufts`: whether llama.cpp may use its CPU extra buffer types;
    `slots`: sequences decoded together. Returns when told to stop.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the service decides when to stop
    try:
        loaded = load_batching_model(model_path, n_ctx, slots, n_threads, extra_bufts)
    except Exception:
        conn.send(("failed", "the model file cannot be loaded"))
        return
    try:
        self_check(loaded)
    except Exception:
        conn.send(("failed", "the model failed its self-check (llama.cpp could not decode)"))
        return
    model = loaded.model
    template = model.metadata().get("tokenizer.chat_template")
    if not template:
        conn.send(("failed", "the model has no chat template (tokenizer.chat_template)"))
        return
    add_bos = bool(model.add_bos_token())
    conn.send(
        (
            "ready",
            {
                "n_ctx": loaded.n_ctx,
                "slots": loaded.slots,
                "chat_template": template,
                "bos_text": model.token_get_text(model.token_bos()),
                "eos_text": model.token_get_text(model.token_eos()),
                "extra_bufts": extra_bufts_in_use(model),
                "cpu_features": cpu_features(),
                "max_token_bytes": max_token_bytes(loaded),
            },
        )
    )

    send_lock = threading.Lock()

    def send(message: tuple[Any, ...]) -> None:
        with send_lock:
            conn.send(message)

    jobs: queue.SimpleQueue[tuple[int, dict[str, Any], threading.Event] | None] = (
        queue.SimpleQueue()
    )
    cancels: dict[int, threading.Event] = {}
    prompts: queue.SimpleQueue[tuple[int, str]] = queue.SimpleQueue()

    def tokenize() -> None:
        while True:
            rid, prompt = prompts.get()
            try:
                ids: list[int] | None = list(
                    model.tokenize(prompt.encode("utf-8"), add_bos=add_bos, special=True)
                )
            except Exception:
                ids = None
            send(("tokens", rid, ids))

    threading.Thread(target=tokenize, name="tokenizer", daemon=True).start()

    def receive() -> None:
        while True:
            try:
                message = conn.recv()
            except (EOFError, OSError):
                os._exit(0)  # the service is gone
            kind = message[0]
            if kind == "tokenize":
                prompts.put((message[1], message[2]))
            elif kind == "generate":
                _, rid, job = message
                flag = threading.Event()
                cancels[rid] = flag
                jobs.put((rid, job, flag))
            elif kind == "cancel":
                flag_or_none = cancels.get(message[1])
                if flag_or_none is not None:
                    flag_or_none.set()
            elif kind == "stop":
                jobs.put(None)
                return

    threading.Thread(target=receive, name="pipe-reader", daemon=True).start()

    runner = BatchRunner(loaded, lambda updates: send(("updates", updates)))
    stopping = False
    while not (stopping and runner.idle):
        # Wait for work only when there is nothing to decode.
        block = runner.idle and not stopping
        while True:
            try:
                item = jobs.get(block=block)
            except queue.Empty:
                break
            block = False
            if item is None:
                stopping = True
                continue
            runner.add(*item)
        runner.step()
        for rid in runner.take_ended():
            cancels.pop(rid, None)


@dataclass
class _Sequence:
    """One generation in the batch: its KV sequence, sampler and progress."""

    rid: int
    seq: int
    prompt: list[int]
    max_tokens: int
    min_output: int
    cancel: threading.Event
    sampler: Any  # llama_sampler_p
    deadline: float = float("inf")  # time.monotonic() at which the time limit ends it
    fed: int = 0  # prompt tokens already decoded
    pos: int = 0  # next KV position
    token: int | None = None  # the sampled token to decode next
    produced: int = 0  # output tokens (end-of-generation not counted)
    pending: list[str] = field(default_factory=list)
    last_flush: float = 0.0
    decoder: Any = field(default_factory=lambda: codecs.getincrementaldecoder("utf-8")("ignore"))


class BatchRunner:
    """Continuous batching over the `slots` sequences of a loaded model (module docstring).

    `emit(updates)` receives the list of `("text", rid, text)` /
    `("end", rid, finish_reason, output_tokens)` updates of each step (never
    an empty list). `add` takes a generation (it waits in arrival order
    while every sequence is taken); `step` runs one decoding step;
    `take_ended` returns the request numbers that ended since the last call.
    Not thread-safe: one thread calls all three.
    """

    def __init__(self, loaded: LoadedModel, emit: Callable[[list[tuple[Any, ...]]], None]) -> None:
        import llama_cpp
        import numpy as np

        self._ll = llama_cpp
        self._np = np
        self._emit = emit
        self._ctx = loaded.context.ctx
        self._memory = llama_cpp.llama_get_memory(self._ctx)
        self._vocab = loaded.model.vocab
        self.n_ctx = loaded.n_ctx
        self._n_vocab = int(llama_cpp.llama_vocab_n_tokens(self._vocab))
        self._eog = np.array(
            [t for t in range(self._n_vocab) if llama_cpp.llama_vocab_is_eog(self._vocab, t)],
            dtype=np.intp,
        )
        self._free = list(range(loaded.slots))
        self._waiting: deque[tuple[int, dict[str, Any], threading.Event]] = deque()
        self._active: list[_Sequence] = []
        self._updates: list[tuple[Any, ...]] = []
        self._ended: list[int] = []
        self._batch = llama_cpp.llama_batch_init(N_BATCH, 0, 1)
        self._piece = ctypes.create_string_buffer(256)
        # The sequences of the step being decoded, for the abort callback.
        self._decoding: list[_Sequence] = []
        # Kept on the runner: llama.cpp holds only a C pointer to it.
        self._abort_callback = llama_cpp.ggml_abort_callback(self._should_abort)
        self._no_callback = llama_cpp.ggml_abort_callback()  # NULL
        # llama-cpp-python's seed rule for create_completion without a seed.
        self._seed = random.Random(llama_cpp.LLAMA_DEFAULT_SEED).randint(0, 2**32)

    @property
    def idle(self) -> bool:
        """No generation running or waiting."""
        return not self._active and not self._waiting

    def add(self, rid: int, job: dict[str, Any], cancel: threading.Event) -> None:
        """Queue a generation; it joins the batch at the next step with a free sequence."""
        self._waiting.append((rid, job, cancel))

    def take_ended(self) -> list[int]:
        """Request numbers of the generations that ended since the last call."""
        ended, self._ended = self._ended, []
        return ended

    # -- one step --------------------------------------------------------------

    def step(self) -> None:
        """Admit waiting generations, decode one batch, sample, and emit the updates."""
        self._admit()
        now = time.monotonic()
        for sequence in list(self._active):
            if sequence.cancel.is_set():
                self._finish(sequence, "cancelled")
            elif now >= sequence.deadline:
                self._finish(sequence, "time")
        if self._active:
            self._decode_and_sample()
        now = time.monotonic()
        for sequence in self._active:
            if sequence.pending and now - sequence.last_flush >= FLUSH_INTERVAL_S:
                self._flush(sequence, now)
        if self._updates:
            updates, self._updates = self._updates, []
            self._emit(updates)

    def _admit(self) -> None:
        ll = self._ll
        while self._waiting and self._free:
            rid, job, cancel = self._waiting.popleft()
            if cancel.is_set():
                self._end(rid, "cancelled", 0)
                continue
            prompt = list(job["prompt_tokens"])
            room = self.n_ctx - len(prompt)
            if not prompt or room < 1:
                self._end(rid, "error", 0)
                continue
            limit = job["max_tokens"]
            max_tokens = room if limit is None or limit <= 0 else min(int(limit), room)
            sampler = self._sampler(float(job["temperature"]), job["grammar"])
            if sampler is None:
                self._end(rid, "error", 0)
                continue
            seq = self._free.pop(0)
            ll.llama_memory_seq_rm(self._memory, seq, -1, -1)
            time_limit = job.get("time_limit_s")
            self._active.append(
                _Sequence(
                    rid=rid,
                    seq=seq,
                    prompt=prompt,
                    max_tokens=max_tokens,
                    min_output=int(job["min_output_tokens"]),
                    cancel=cancel,
                    sampler=sampler,
                    deadline=float("inf")
                    if time_limit is None
                    else time.monotonic() + float(time_limit),
                )
            )

    def _sampler(self, temperature: float, grammar: str | None) -> Any:
        """A new sampler chain, or `None` when llama.cpp refuses the grammar."""
        ll = self._ll
        chain = ll.llama_sampler_chain_init(ll.llama_sampler_chain_default_params())
        parts = []
        if grammar is not None:
            constrained = ll.llama_sampler_init_grammar(
                self._vocab, grammar.encode("utf-8"), b"root"
            )
            if not constrained:
                ll.llama_sampler_free(chain)
                return None
            parts.append(constrained)
        if temperature == 0.0:
            parts.append(ll.llama_sampler_init_greedy())
        elif temperature < 0.0:
            parts.append(ll.llama_sampler_init_dist(self._seed))
        else:
            parts += [
                ll.llama_sampler_init_top_k(TOP_K),
                ll.llama_sampler_init_typical(TYPICAL_P, 1),
                ll.llama_sampler_init_top_p(TOP_P, 1),
                ll.llama_sampler_init_min_p(MIN_P, 1),
                ll.llama_sampler_init_temp(temperature),
                ll.llama_sampler_init_dist(self._seed),
            ]
        for part in parts:
            ll.llama_sampler_chain_add(chain, part)
        return chain

    def _decode_and_sample(self) -> None:
        ll, batch = self._ll, self._batch
        n = 0
        sampling: list[tuple[_Sequence, int]] = []  # (sequence, batch index of its logits)

        tokens, positions, n_seq, seq_ids, wants = (
            batch.token,
            batch.pos,
            batch.n_seq_id,
            batch.seq_id,
            batch.logits,
        )

        def put(token: int, pos: int, seq: int, logits: bool) -> None:
            nonlocal n
            tokens[n] = token
            positions[n] = pos
            n_seq[n] = 1
            seq_ids[n][0] = seq
            wants[n] = logits
            n += 1

        before = [(sequence, sequence.fed, sequence.pos) for sequence in self._active]
        for sequence in self._active:  # generating sequences: one token each
            if sequence.token is not None:
                sampling.append((sequence, n))
                put(sequence.token, sequence.pos, sequence.seq, True)
                sequence.pos += 1
        for sequence in self._active:  # prompts, in arrival order, in the room left
            if sequence.token is not None or n >= N_BATCH:
                continue
            take = min(len(sequence.prompt) - sequence.fed, N_BATCH - n)
            for i in range(sequence.fed, sequence.fed + take):
                put(sequence.prompt[i], i, sequence.seq, False)
            sequence.fed += take
            sequence.pos = sequence.fed
            if sequence.fed == len(sequence.prompt):
                wants[n - 1] = True
                sampling.append((sequence, n - 1))
        batch.n_tokens = n
        # Only steps that hold prompt tokens get the abort callback: llama.cpp
        # calls it after every graph node, and the Python call costs more than
        # a small model's whole step of single tokens (TinyChat decoded at a
        # third of its speed with it on every step), while such a step is
        # short anyway and the service checks cancellations between steps.
        watched = n > len(sampling) or any(s.token is None for s, _ in sampling)
        if watched:
            self._decoding = list(self._active)
            ll.llama_set_abort_callback(self._ctx, self._abort_callback, None)
        try:
            status = ll.llama_decode(self._ctx, batch)
        finally:
            if watched:
                ll.llama_set_abort_callback(self._ctx, self._no_callback, None)
                self._decoding = []
        if status == 2:  # aborted: a generation of this step was cancelled or expired
            for sequence, fed, pos in before:
                sequence.fed, sequence.pos = fed, pos
                ll.llama_memory_seq_rm(self._memory, sequence.seq, pos, -1)
            return  # the next step ends them; the others redo their part
        if status != 0:
            print(f"napllm-lmsp worker: llama_decode returned {status}", file=sys.stderr)
            for sequence in {id(s): s for s, _ in sampling}.values():
                self._finish(sequence, "error")
            for sequence in list(self._active):  # a prompt cut short in this step
                if sequence.token is None:
                    self._finish(sequence, "error")
            return
        for sequence, index in sampling:
            self._sample(sequence, index)

    def _should_abort(self, _data: Any) -> bool:
        """llama.cpp's abort callback: whether to stop the running `llama_decode`.

        Called by llama.cpp on the decoding thread after every graph node,
        so it only reads flags and the clock. True when a generation of the
        step was cancelled or is past its time limit.
        """
        decoding = self._decoding
        if not decoding:
            return False
        now = time.monotonic()
        return any(s.cancel.is_set() or now >= s.deadline for s in decoding)

    def _sample(self, sequence: _Sequence, index: int) -> None:
        ll, np = self._ll, self._np
        if sequence.produced < sequence.min_output and self._eog.size:
            logits = np.ctypeslib.as_array(
                ll.llama_get_logits_ith(self._ctx, index), shape=(self._n_vocab,)
            )
            logits[self._eog] = -np.inf
        token = int(ll.llama_sampler_sample(sequence.sampler, self._ctx, index))
        if ll.llama_vocab_is_eog(self._vocab, token):
            self._finish(sequence, "stop")
            return
        sequence.produced += 1
        text = sequence.decoder.decode(self._token_bytes(token))
        if text:
            sequence.pending.append(text)
        if sequence.produced >= sequence.max_tokens:
            self._finish(sequence, "length")
        else:
            sequence.token = token

    def _token_bytes(self, token: int) -> bytes:
        ll = self._ll
        size = ll.llama_token_to_piece(self._vocab, token, self._piece, len(self._piece), 0, False)
        if size < 0:  # longer than the buffer
            self._piece = ctypes.create_string_buffer(-size)
            size = ll.llama_token_to_piece(
                self._vocab, token, self._piece, len(self._piece), 0, False
            )
        return self._piece.raw[:size]

    def _flush(self, sequence: _Sequence, now: float) -> None:
        self._updates.append(("text", sequence.rid, "".join(sequence.pending)))
        sequence.pending.clear()
        sequence.last_flush = now

    def _finish(self, sequence: _Sequence, reason: str) -> None:
        """End `sequence`: flush its text, free its sampler and clear its KV sequence."""
        tail = sequence.decoder.decode(b"", final=True)
        if tail:
            sequence.pending.append(tail)
        if sequence.pending:
            self._flush(sequence, time.monotonic())
        self._active.remove(sequence)
        self._ll.llama_sampler_free(sequence.sampler)
        self._ll.llama_memory_seq_rm(self._memory, sequence.seq, -1, -1)
        self._free.append(sequence.seq)
        self._end(sequence.rid, reason, sequence.produced)

    def _end(self, rid: int, reason: str, produced: int) -> None:
        self._updates.append(("end", rid, reason, produced))
        self._ended.append(rid)
