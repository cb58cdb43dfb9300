"""The model worker process: the only place llama.cpp runs (docs/lmsp.md, "Crash isolation").

`worker_main` is the target of a `multiprocessing` process started with the
`spawn` method by `engine.Engine`. It loads the GGUF model, then serves
messages from the service over one duplex pipe (`multiprocessing.Pipe`):

Service -> worker (tuples; `rid` is the service's request number):
- `("tokenize", rid, prompt)`: token ids of a rendered prompt.
- `("generate", rid, job)`: run one generation; `job` is a dict with
  `prompt_tokens`, `max_tokens` (`None`: no limit), `temperature`,
  `grammar` (GBNF text or `None`) and `min_output_tokens`.
- `("cancel", rid)`: stop that generation between tokens.
- `("stop",)`: exit after the running generation.

Worker -> service:
- `("ready", info)` once, after loading and the self-check (`info`:
  `n_ctx`, `chat_template`, `bos_text`, `eos_text`, `extra_bufts` (whether
  llama.cpp's CPU extra buffer types are in use), `cpu_features`), or
  `("failed", reason)` and exit.
- `("tokens", rid, ids)` (`ids` is `None` when tokenization failed).
- `("text", rid, text)`: generated text, several tokens batched into one
  message when they come faster than `FLUSH_INTERVAL_S`.
- `("end", rid, finish_reason, output_tokens)`: `stop`, `length`,
  `cancelled` or `error`.

Rules
- Before it reports `ready`, the worker decodes a short prompt
  (`llama_load.self_check`): a CPU fast path that crashes kills the worker
  here, before any request, and the supervisor decides what to do.
- Generations run one at a time on the worker's main thread; messages are
  read on a second thread (so cancellation and tokenization do not wait).
- The worker exits when the service's end of the pipe closes: it never
  outlives the service.
- Anything llama.cpp does wrong here (a segmentation fault, an abort, an
  out-of-memory kill) ends this process only; the service notices the
  closed pipe, fails the running generation and starts a new worker.
- `output_tokens` counts sampled tokens without the end-of-generation token.
"""

from __future__ import annotations

import os
import queue
import signal
import sys
import threading
import time
from collections.abc import Iterator
from multiprocessing.connection import Connection
from typing import Any, cast

from .llama_load import (
    cpu_features,
    default_threads,
    extra_bufts_in_use,
    load_llama,
    self_check,
)

#: Seconds of generated text collected into one pipe message at most.
FLUSH_INTERVAL_S = 0.005


def worker_main(
    conn: Connection,
    model_path: str,
    n_ctx: int,
    n_threads: int | None,
    extra_bufts: bool = True,
) -> None:
    """Load the model, check it, and serve the pipe protocol of the module docstring.

    `extra_bufts`: whether llama.cpp may use its CPU extra buffer types
    (`llama_load.load_llama`).
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the service decides when to stop
    try:
        import llama_cpp
        import numpy as np
        from llama_cpp import LogitsProcessorList, StoppingCriteriaList
        from llama_cpp.llama_grammar import LlamaGrammar

        threads, batch_threads = default_threads()
        llama = load_llama(
            model_path,
            extra_bufts=extra_bufts,
            n_ctx=n_ctx,
            n_threads=n_threads or threads,
            n_threads_batch=max(n_threads or 0, batch_threads),
            verbose=False,
        )
    except Exception:
        conn.send(("failed", "the model file cannot be loaded"))
        return
    try:
        self_check(llama)
    except Exception:
        conn.send(("failed", "the model failed its self-check (llama.cpp could not decode)"))
        return
    template = llama.metadata.get("tokenizer.chat_template")
    if not template:
        conn.send(("failed", "the model has no chat template (tokenizer.chat_template)"))
        return
    model = llama._model
    add_bos = bool(model.add_bos_token())
    eog_ids = np.array(
        [t for t in range(llama.n_vocab()) if llama_cpp.llama_vocab_is_eog(model.vocab, t)],
        dtype=np.intp,
    )
    conn.send(
        (
            "ready",
            {
                "n_ctx": int(llama.n_ctx()),
                "chat_template": template,
                "bos_text": model.token_get_text(llama.token_bos()),
                "eos_text": model.token_get_text(llama.token_eos()),
                "extra_bufts": extra_bufts_in_use(llama),
                "cpu_features": cpu_features(),
            },
        )
    )

    send_lock = threading.Lock()

    def send(message: tuple[Any, ...]) -> None:
        with send_lock:
            conn.send(message)

    jobs: queue.Queue[tuple[int, dict[str, Any], threading.Event] | None] = queue.Queue()
    cancels: dict[int, threading.Event] = {}

    def receive() -> None:
        while True:
            try:
                message = conn.recv()
            except (EOFError, OSError):
                os._exit(0)  # the service is gone
            kind = message[0]
            if kind == "tokenize":
                _, rid, prompt = message
                try:
                    ids: list[int] | None = list(
                        llama.tokenize(prompt.encode("utf-8"), add_bos=add_bos, special=True)
                    )
                except Exception:
                    ids = None
                send(("tokens", rid, ids))
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

    def run(rid: int, job: dict[str, Any], cancel: threading.Event) -> None:
        sampled = 0
        min_output = int(job["min_output_tokens"])

        def count_and_shape(_input_ids: Any, scores: Any) -> Any:
            nonlocal sampled
            sampled += 1
            if sampled <= min_output and eog_ids.size:
                scores[eog_ids] = -np.inf
            return scores

        def cancelled(_input_ids: Any, _scores: Any) -> bool:
            return cancel.is_set()

        finish: str | None = None
        pending: list[str] = []
        last_flush = 0.0
        try:
            grammar = (
                LlamaGrammar.from_string(job["grammar"], verbose=False)
                if job["grammar"] is not None
                else None
            )
            stream = llama.create_completion(
                prompt=job["prompt_tokens"],
                max_tokens=job["max_tokens"] if job["max_tokens"] is not None else -1,
                temperature=job["temperature"],
                grammar=grammar,
                stream=True,
                logits_processor=LogitsProcessorList([count_and_shape]),
                stopping_criteria=StoppingCriteriaList([cancelled]),
            )
            for chunk in cast(Iterator[Any], stream):
                choice = chunk["choices"][0]
                if choice["text"]:
                    pending.append(choice["text"])
                    now = time.monotonic()
                    if now - last_flush >= FLUSH_INTERVAL_S:
                        send(("text", rid, "".join(pending)))
                        pending.clear()
                        last_flush = now
                if choice["finish_reason"] is not None:
                    finish = choice["finish_reason"]
        except Exception as exc:
            print(f"napllm-lmsp worker: generation failed ({type(exc).__name__})", file=sys.stderr)
            finish = "error"
        if pending:
            send(("text", rid, "".join(pending)))
        if finish == "error":
            send(("end", rid, "error", max(sampled - 1, 0)))
        elif cancel.is_set():
            send(("end", rid, "cancelled", max(sampled - 1, 0)))
        elif finish == "length":
            send(("end", rid, "length", sampled))
        else:
            # Stopped on an end-of-generation token, which is not output.
            send(("end", rid, "stop", max(sampled - 1, 0)))

    while (item := jobs.get()) is not None:
        run(*item)
        cancels.pop(item[0], None)
