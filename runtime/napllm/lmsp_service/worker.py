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
  it; `None`: no limit), `grammar_budget_s` and `token_grammar_budget_s`
  (seconds of grammar work for the generation and for one token; `None`:
  batching.py's defaults) and `prompt_reuse` (whether it may reuse the KV
  state an earlier generation left for the same leading prompt tokens,
  prompt_cache.py). The service never has more than `slots`
  generations in the worker at once.
- `("cancel", rid)`: stop that generation at once, inside a decoding step
  if it is in one.
- `("stop",)`: exit once the running generations have ended.

Worker -> service:
- `("ready", info)` once, after loading and the self-check (`info`:
  `n_ctx` (the context of one sequence), `slots`, `chat_template`,
  `bos_text`, `eos_text`, `add_bos`/`add_eos` (whether tokenizing adds
  them; prompt.py), `extra_bufts` (whether llama.cpp's CPU extra
  buffer types are in use), `cpu_features`, `max_token_bytes` (the
  longest text of one token, special tokens included: a prompt of more
  UTF-8 bytes than `n_ctx` times this cannot fit, whatever its tokens)),
  or `("failed", reason)` and exit.
- `("tokens", rid, ids)` (`ids` is `None` when tokenization failed).
- `("updates", [update, ...])`: what one decoding step produced for the
  running generations, in order; an update is a `batching.TextUpdate`
  (`rid`, `text`: generated text, several tokens joined when they come
  faster than `batching.FLUSH_INTERVAL_S`) or a `batching.EndUpdate`
  (`rid`, `finish_reason`, `output_tokens`, `cached_tokens`) with
  `finish_reason` `stop`, `length`, `cancelled`, `time` (its
  `time_limit_s` ran out), `grammar` (its grammar work ran past a budget)
  or `error`, and `cached_tokens` the prompt tokens it did not decode
  because a kept sequence held them (prompt_cache.py).

Rules
- The model and its context come from batch_load.py
  (`batch_load.load_batching_model`, through `llama_load.load_model`, the
  one place that decides the model parameters); the generation loop is
  `batching.BatchRunner`. This module is the process and its protocol.
- Before it reports `ready`, the worker decodes a short prompt as one batch
  and then one more token (`batch_load.self_check`): a CPU fast path that
  crashes kills the worker here, before any request, and the supervisor
  decides what to do (engine.py, "Any CPU").
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
"""

from __future__ import annotations

import os
import queue
import signal
import threading
from multiprocessing.connection import Connection
from typing import Any

from .batch_load import DEFAULT_SLOTS, load_batching_model, max_token_bytes, self_check
from .batching import BatchRunner
from .llama_load import cpu_features, extra_bufts_in_use

__all__ = ["DEFAULT_SLOTS", "worker_main"]


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
    `n_threads`: llama.cpp threads (`None`: `batch_load.context_params`'s default);
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
                "add_bos": add_bos,
                "add_eos": bool(model.add_eos_token()),
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
                    # add_special (the vocabulary's BOS/EOS), special tokens parsed:
                    # llama-server's tokenization of a chat prompt (prompt.py).
                    model.tokenize(prompt.encode("utf-8"), add_bos=True, special=True)
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
