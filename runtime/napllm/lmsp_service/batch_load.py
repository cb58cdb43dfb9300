"""The model worker's llama.cpp model and batching context (docs/lmsp.md, "Crash isolation").

Rules
- Runs only in the model worker process (worker.py); nothing in the
  service process imports llama.cpp through this module.
- One context holds `slots` sequences, each with its own part of the KV
  cache (`n_ctx` tokens, not shared: a long request cannot take another's
  room, `kv_unified` off), decoded in steps of at most `N_BATCH` tokens
  (batching.py).
- The model itself comes from `llama_load.load_model`, the one place that
  decides the model parameters (and the CPU fast path); this module adds
  only the context parameters (sizes and threads).
- `self_check` decodes the two shapes a generation uses (a prompt batch,
  then one token) before the worker reports ready, so a CPU code path that
  crashes llama.cpp does so before any request (engine.py, "Any CPU").
- `max_token_bytes` bounds the bytes one token covers, so the service can
  refuse a prompt that cannot fit without tokenizing it.
"""

from __future__ import annotations

import ctypes
import logging
from dataclasses import dataclass
from typing import Any

from .llama_load import default_threads, load_model
from .llama_load import self_check_context as _self_check_context

#: Tokens one decoding step holds at most (the `llama_batch` size).
N_BATCH = 512
#: Sequences (concurrent generations) when the service does not say.
DEFAULT_SLOTS = 4


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
