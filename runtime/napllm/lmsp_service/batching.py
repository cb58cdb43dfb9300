"""Continuous batching in the model worker: the generation loop (docs/lmsp.md 9.1).

Rules
- `BatchRunner` decodes the `slots` sequences of one context
  (batch_load.py). Every generation gets a free sequence when it arrives
  and joins the running batch at the next step: one `llama_decode` per
  step holds the next token of every generating sequence and, in the room
  left (up to `N_BATCH` tokens), the prompt tokens of the sequences still
  reading their prompt (room given in arrival order, long prompts spread
  over steps). The batch lists its tokens by increasing sequence id: with
  cells of its own per sequence, llama.cpp decodes one pass per run of
  consecutive ids in listed order, each pass reading every weight.
- Each generation has its own sampler chain (greedy at temperature 0, else
  llama-cpp-python's default chain: top-k 40, typical 1.0, top-p 0.95,
  min-p 0.05, temperature, seeded draw), its own grammar, output limit,
  minimum output (end-of-generation tokens are masked in its logits until
  then) and cancellation flag. An ending generation (stop, limit,
  cancellation, error) clears its sequence at once and the sequence takes
  the next generation.
- A grammar llama.cpp refuses ends that generation only (`error`); a
  failed `llama_decode` ends the generations of that step (`error`).
- Sampling never hands llama.cpp a token its grammar rejects (llama.cpp
  throws inside the sampler and the worker aborts): a generation's grammar
  is applied to a copy of its logits (after the end-of-generation mask of
  the minimum output), and when no candidate is left the generation ends:
  `stop` when the grammar is complete (it accepts only the end), `error`
  otherwise. Only then does the rest of the chain pick a token, and the
  grammar accepts the token it allowed.
- Grammar work is bounded for real (docs/security.md, "grammar cost"): a
  generation with a grammar samples on a pool thread (llama.cpp releases
  the interpreter lock there) from a copy of its logits, and the step
  waits for it at most `SAMPLE_WAIT_S`; a sequence still sampling sits
  out the following steps while the others go on decoding, so one
  sequence's grammar delays the others' tokens by at most `SAMPLE_WAIT_S`
  a step. A generation whose sampling of one token runs past
  `TOKEN_GRAMMAR_BUDGET_S`, or whose grammar work adds up past
  `GENERATION_GRAMMAR_BUDGET_S`, ends with `grammar` (its sampler is
  freed when the pool thread returns). A token's clock starts when a pool
  thread starts its work, not when it was queued, and the pool has two
  threads per sequence: the sampling an ended generation left running
  neither ends another generation nor takes the threads it needs.
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
  cancellation or time limit (scheduler.py). A sequence whose sampling is
  still running when it ends leaves that work to finish on its pool thread.
- `output_tokens` counts sampled tokens without the end-of-generation token.
- Prompt reuse (prompt_cache.py): an ending generation leaves its KV cells
  in place and gives its sequence back with the exact ids they hold (the
  prompt and the decoded output tokens); a new generation takes the free
  sequence sharing the longest prefix of ids with its prompt, the cells
  past that prefix are removed (`llama_memory_seq_rm`; when llama.cpp
  cannot remove a part, or the cells left do not hold every position of
  the prefix, as in a sliding-window memory, the whole sequence is
  cleared) and only the rest of the prompt is decoded. A generation that ended `error` (its cells
  may hold a failed step) gives its sequence back cleared. A job whose
  `prompt_reuse` is false takes a cleared sequence.
- Updates are named records: `TextUpdate` and `EndUpdate` (picklable, for
  the pipe to the service).
- The loop is written against llama-cpp-python's low-level bindings
  (`llama_batch`, `llama_decode`, `llama_sampler_*`, `llama_memory_*`)
  because its `Llama` class decodes one sequence at a time.
"""

from __future__ import annotations

import codecs
import ctypes
import random
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from .batch_load import N_BATCH, LoadedModel
from .prompt_cache import KeptPrefixes

#: Seconds of generated text collected into one update at most.
FLUSH_INTERVAL_S = 0.005
#: Sampler settings of llama-cpp-python's `create_completion`, kept so that
#: answers do not change with the batching loop.
TOP_K, TYPICAL_P, TOP_P, MIN_P = 40, 1.0, 0.95, 0.05
#: Seconds a step waits for the grammar sampling of its sequences; a
#: sequence whose sampling takes longer sits out steps meanwhile.
SAMPLE_WAIT_S = 0.02
#: Seconds of grammar work one token may take before its generation ends.
TOKEN_GRAMMAR_BUDGET_S = 1.0
#: Seconds of grammar work one generation may take in all.
GENERATION_GRAMMAR_BUDGET_S = 15.0


def piece_decoder() -> codecs.IncrementalDecoder:
    """The incremental decoder of a generation's token bytes into its text.

    A token may hold part of a UTF-8 sequence; the decoder keeps it until
    the sequence is complete. Bytes that never form one (a model may sample
    a lone byte token) become U+FFFD, as llama-server writes them, so the
    same token ids give the same text (docs/lmsp.md 9.4); they used to be
    dropped.
    """
    return codecs.getincrementaldecoder("utf-8")("replace")


class TextUpdate(NamedTuple):
    """Generated text of generation `rid` (valid UTF-8, possibly several tokens)."""

    rid: int
    text: str


class EndUpdate(NamedTuple):
    """The end of generation `rid`.

    `finish_reason`: `stop`, `length`, `cancelled`, `time`, `grammar` or
    `error`; `output_tokens`: sampled tokens without the end-of-generation
    token; `cached_tokens`: prompt tokens whose KV state was reused from an
    earlier generation (not decoded again).
    """

    rid: int
    finish_reason: str
    output_tokens: int
    cached_tokens: int = 0


@dataclass
class _Sequence:
    """One generation in the batch: its KV sequence, sampler and progress."""

    rid: int
    seq: int
    prompt: list[int]
    max_tokens: int
    min_output: int
    cancel: threading.Event
    sampler: Any  # llama_sampler_p: the chain without the grammar
    grammar: Any  # llama_sampler_p of the grammar, or None
    deadline: float = float("inf")  # time.monotonic() at which the time limit ends it
    fed: int = 0  # prompt tokens already decoded
    pos: int = 0  # next KV position
    token: int | None = None  # the sampled token to decode next
    produced: int = 0  # output tokens (end-of-generation not counted)
    outputs: list[int] = field(default_factory=list)  # the sampled output ids
    cached: int = 0  # prompt tokens reused from a kept sequence
    pending: list[str] = field(default_factory=list)
    last_flush: float = 0.0
    decoder: Any = field(default_factory=piece_decoder)
    future: Future[tuple[str, int, float]] | None = None  # sampling on the pool
    sample_started: float = 0.0  # time.monotonic() when a pool thread began it (0: queued)
    grammar_s: float = 0.0  # grammar work so far, in seconds
    token_budget_s: float = TOKEN_GRAMMAR_BUDGET_S
    grammar_budget_s: float = GENERATION_GRAMMAR_BUDGET_S


class BatchRunner:
    """Continuous batching over the `slots` sequences of a loaded model (module docstring).

    `emit(updates)` receives the list of `TextUpdate` / `EndUpdate`
    records of each step (never an empty list). `add` takes a generation (it waits in arrival order
    while every sequence is taken); `step` runs one decoding step;
    `take_ended` returns the request numbers that ended since the last call.
    Not thread-safe: one thread calls all three.
    """

    def __init__(
        self, loaded: LoadedModel, emit: Callable[[list[TextUpdate | EndUpdate]], None]
    ) -> None:
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
        self._sequences = KeptPrefixes(loaded.slots)
        # One llama_token_data per vocabulary entry: int32 id, float logit, float p.
        self._token_dtype = np.dtype([("id", np.int32), ("logit", np.float32), ("p", np.float32)])
        self._ids = np.arange(self._n_vocab, dtype=np.int32)
        # Twice the sequences: a sampling left running by a generation that
        # ended (its budget spent) must not hold the thread of a live one.
        self._pool = ThreadPoolExecutor(2 * loaded.slots, thread_name_prefix="grammar")
        self._waiting: deque[tuple[int, dict[str, Any], threading.Event]] = deque()
        self._active: list[_Sequence] = []
        self._updates: list[TextUpdate | EndUpdate] = []
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
        self._collect()
        now = time.monotonic()
        for sequence in list(self._active):
            if sequence.cancel.is_set():
                self._finish(sequence, "cancelled")
            elif now >= sequence.deadline:
                self._finish(sequence, "time")
            elif sequence.grammar_s > sequence.grammar_budget_s or (
                sequence.future is not None
                and sequence.sample_started > 0.0
                and now - sequence.sample_started > sequence.token_budget_s
            ):
                self._finish(sequence, "grammar")
        if any(s.future is None for s in self._active):
            self._decode_and_sample()
        elif self._active:  # every sequence is sampling: wait for one of them
            wait([s.future for s in self._active if s.future], SAMPLE_WAIT_S, FIRST_COMPLETED)
            self._collect()
        now = time.monotonic()
        for sequence in self._active:
            if sequence.pending and now - sequence.last_flush >= FLUSH_INTERVAL_S:
                self._flush(sequence, now)
        if self._updates:
            updates, self._updates = self._updates, []
            self._emit(updates)

    def _admit(self) -> None:
        ll = self._ll
        while self._waiting and self._sequences.has_free:
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
            grammar = None
            if job["grammar"] is not None:
                grammar = ll.llama_sampler_init_grammar(
                    self._vocab, job["grammar"].encode("utf-8"), b"root"
                )
                if not grammar:
                    self._end(rid, "error", 0)
                    continue
            sampler = self._sampler(float(job["temperature"]))
            seq, shared = self._sequences.take(prompt, bool(job.get("prompt_reuse", True)))
            if not (shared and self._cut(seq, shared)):
                shared = 0  # nothing to reuse, or llama.cpp cannot cut this memory
                ll.llama_memory_seq_rm(self._memory, seq, -1, -1)
            time_limit = job.get("time_limit_s")
            self._active.append(
                _Sequence(
                    rid=rid,
                    seq=seq,
                    prompt=prompt,
                    fed=shared,
                    pos=shared,
                    cached=shared,
                    max_tokens=max_tokens,
                    min_output=int(job["min_output_tokens"]),
                    cancel=cancel,
                    sampler=sampler,
                    grammar=grammar,
                    token_budget_s=float(
                        job.get("token_grammar_budget_s") or TOKEN_GRAMMAR_BUDGET_S
                    ),
                    grammar_budget_s=float(
                        job.get("grammar_budget_s") or GENERATION_GRAMMAR_BUDGET_S
                    ),
                    deadline=float("inf")
                    if time_limit is None
                    else time.monotonic() + float(time_limit),
                )
            )

    def _cut(self, seq: int, shared: int) -> bool:
        """Keep exactly positions 0..shared-1 of `seq`; False when its cells cannot be trusted.

        False when llama.cpp refuses the partial removal, or when the cells
        left do not run from 0 to `shared - 1` (a sliding-window memory drops
        old cells: those positions are gone and must be decoded again).
        """
        ll, memory = self._ll, self._memory
        if not ll.llama_memory_seq_rm(memory, seq, shared, -1):
            return False
        return bool(
            ll.llama_memory_seq_pos_min(memory, seq) == 0
            and ll.llama_memory_seq_pos_max(memory, seq) == shared - 1
        )

    def _sampler(self, temperature: float) -> Any:
        """A new sampler chain (the grammar is applied before it, in `_pick`)."""
        ll = self._ll
        chain = ll.llama_sampler_chain_init(ll.llama_sampler_chain_default_params())
        parts = []
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
        # What each sequence feeds: its next token when generating; else, for
        # prompts in arrival order, prompt tokens in the room the batch has left.
        room = N_BATCH - sum(1 for s in self._active if s.token is not None)
        feeds: dict[int, int] = {}
        for sequence in self._active:
            if sequence.token is None and sequence.future is None and room > 0:
                feeds[id(sequence)] = take = min(len(sequence.prompt) - sequence.fed, room)
                room -= take
        # The batch lists its sequences in increasing sequence id: with a
        # memory of one part per sequence (kv_unified off), llama.cpp decodes
        # in one pass only sequences listed in that order, one pass per run of
        # ids otherwise (llama_batch_allocr::split_equal), and each pass reads
        # every weight again (steps cost 1.5x the CPU when listed in arrival order).
        for sequence in sorted(self._active, key=lambda s: s.seq):
            if sequence.token is not None:  # generating: one token
                sampling.append((sequence, n))
                put(sequence.token, sequence.pos, sequence.seq, True)
                sequence.pos += 1
            elif id(sequence) in feeds:
                take = feeds[id(sequence)]
                for i in range(sequence.fed, sequence.fed + take):
                    put(sequence.prompt[i], i, sequence.seq, False)
                sequence.fed += take
                sequence.pos = sequence.fed
                if sequence.fed == len(sequence.prompt):
                    wants[n - 1] = True
                    sampling.append((sequence, n - 1))
        if n == 0:
            return
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
                if sequence.token is None and sequence.future is None:
                    self._finish(sequence, "error")
            return
        np = self._np
        pending = []
        for sequence, index in sampling:
            sequence.token = None
            logits = np.ctypeslib.as_array(
                ll.llama_get_logits_ith(self._ctx, index), shape=(self._n_vocab,)
            )
            sequence.sample_started = time.monotonic()
            if sequence.grammar is None:  # nothing can reject the token: llama.cpp samples
                if sequence.produced < sequence.min_output and self._eog.size:
                    logits[self._eog] = -np.inf
                token = int(ll.llama_sampler_sample(sequence.sampler, self._ctx, index))
                self._take(sequence, ("token", token, 0.0))
            else:  # a copy: the logits are valid only until the next llama_decode
                sequence.sample_started = 0.0  # set by the pool thread when it starts
                sequence.future = self._pool.submit(self._pick, sequence, logits.copy())
                pending.append(sequence.future)
        if pending:
            wait(pending, SAMPLE_WAIT_S)
            self._collect()

    def _collect(self) -> None:
        """Take the tokens of the sequences whose pool sampling has finished."""
        for sequence in list(self._active):
            future = sequence.future
            if future is not None and future.done():
                sequence.future = None
                self._take(sequence, future.result())

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

    def _pick(self, sequence: _Sequence, logits: Any) -> tuple[str, int, float]:
        """Sample one token of `sequence` from a copy of its `logits` (n_vocab floats).

        Runs on a pool thread, for a sequence with a grammar. Returns
        `("token", id, grammar seconds)`, or `("complete", -1, s)` when the
        grammar accepts only the end of generation and the minimum output
        masks it, or `("empty", -1, s)` when no candidate is
        left. Never lets llama.cpp accept a token its grammar rejects.
        """
        sequence.sample_started = time.monotonic()  # the token's budget starts now
        ll, np = self._ll, self._np
        data = np.empty(self._n_vocab, dtype=self._token_dtype)
        data["id"] = self._ids
        data["logit"] = logits
        data["p"] = 0.0
        masked = sequence.produced < sequence.min_output and self._eog.size > 0
        if masked:
            data["logit"][self._eog] = -np.inf
        candidates = ll.llama_token_data_array(
            data=data.ctypes.data_as(ctypes.POINTER(ll.llama_token_data)),
            size=self._n_vocab,
            selected=-1,
            sorted=False,
        )
        spent = 0.0
        if sequence.grammar is not None:
            started = time.perf_counter()
            ll.llama_sampler_apply(sequence.grammar, ctypes.byref(candidates))
            spent = time.perf_counter() - started
            if not np.isfinite(data["logit"]).any():
                return ("complete" if masked and self._allows_end(sequence) else "empty", -1, spent)
        elif not np.isfinite(data["logit"]).any():
            return ("empty", -1, spent)
        ll.llama_sampler_apply(sequence.sampler, ctypes.byref(candidates))
        selected = int(candidates.selected)
        if not 0 <= selected < int(candidates.size):
            return ("empty", -1, spent)
        chosen = candidates.data[selected]
        token = int(chosen.id)
        if not np.isfinite(chosen.logit):
            return ("empty", -1, spent)
        if sequence.grammar is not None:
            started = time.perf_counter()
            ll.llama_sampler_accept(sequence.grammar, token)
            spent += time.perf_counter() - started
        ll.llama_sampler_accept(sequence.sampler, token)
        return ("token", token, spent)

    def _allows_end(self, sequence: _Sequence) -> bool:
        """Whether `sequence`'s grammar accepts an end-of-generation token now."""
        ll, np = self._ll, self._np
        one = np.zeros(1, dtype=self._token_dtype)
        one["id"] = self._eog[0]
        candidates = ll.llama_token_data_array(
            data=one.ctypes.data_as(ctypes.POINTER(ll.llama_token_data)),
            size=1,
            selected=-1,
            sorted=False,
        )
        ll.llama_sampler_apply(sequence.grammar, ctypes.byref(candidates))
        return bool(np.isfinite(one["logit"][0]))

    def _take(self, sequence: _Sequence, picked: tuple[str, int, float]) -> None:
        """Apply what `_pick` answered to `sequence` (main thread)."""
        outcome, token, spent = picked
        sequence.grammar_s += spent
        if outcome == "complete":
            self._finish(sequence, "stop")
            return
        if outcome == "empty":
            self._finish(sequence, "error")
            return
        ll = self._ll
        if ll.llama_vocab_is_eog(self._vocab, token):
            self._finish(sequence, "stop")
            return
        sequence.produced += 1
        sequence.outputs.append(token)
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
        self._updates.append(TextUpdate(sequence.rid, "".join(sequence.pending)))
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
        samplers = [sequence.sampler] + ([sequence.grammar] if sequence.grammar else [])
        free = self._ll.llama_sampler_free

        def release(_done: object = None) -> None:
            for sampler in samplers:
                free(sampler)

        if sequence.future is not None:  # its pool thread still samples: free after it
            sequence.future.add_done_callback(release)
            sequence.future = None
        else:
            release()
        held: list[int] = []
        if reason == "error":  # its cells may hold a failed step: nothing is kept
            self._ll.llama_memory_seq_rm(self._memory, sequence.seq, -1, -1)
        else:  # positions 0..pos-1 hold the prompt, then the decoded output tokens
            held = (sequence.prompt + sequence.outputs)[: sequence.pos]
        self._sequences.give_back(sequence.seq, held)
        self._end(sequence.rid, reason, sequence.produced, sequence.cached)

    def _end(self, rid: int, reason: str, produced: int, cached: int = 0) -> None:
        self._updates.append(EndUpdate(rid, reason, produced, cached))
        self._ended.append(rid)
