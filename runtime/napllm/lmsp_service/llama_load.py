"""Loading a GGUF model with llama.cpp so that it runs on any CPU (docs/lmsp.md, "Any CPU").

Rules
- Every place that loads a model does it through this module, so the
  model parameters that depend on the machine are decided in one place:
  `load_llama` for a `llama_cpp.Llama` (tests, benchmarks), `load_model`
  for the low-level `LlamaModel` the batching worker decodes with; both
  take their parameters from `model_params`.
- llama.cpp's CPU backend has "extra buffer types": weight layouts chosen
  for the CPU it runs on (AMX tiles on Intel Xeons with `amx_int8`, and
  the repacked AArch64/x86 layouts). On some CPUs the compiled fast path
  crashes the process in the first `llama_decode` (a segmentation fault;
  seen with llama-cpp-python 0.3.36 on Xeons with AMX). The C field
  `llama_model_params.use_extra_bufts` turns them off; the weights then use
  the plain layout, which gives the same answers at a somewhat lower speed.
- llama-cpp-python 0.3.x has no keyword for that field, so `load_llama`
  wraps `llama_model_default_params` (the function `Llama.__init__` calls
  to start from the defaults) for the duration of one construction. This
  is our own code because the library offers no other way; the wrapper is
  removed again before `load_llama` returns, also on errors.
- `self_check` (for a `Llama`) and `self_check_context` (for a low-level
  model and context) run one short prompt through `llama_decode` (a batch
  of about 50 tokens, then one token, the two shapes a generation uses), so
  a crashing fast path shows before the first real request, in a process
  that can die without harm.
- Threads: llama-cpp-python's defaults count the host's cores
  (`os.cpu_count()`), which in a container or under `taskset` can be many
  more than the process may use; too many threads on few cores make
  decoding several times slower. `default_threads` counts the cores this
  process may run on (its affinity mask and a cgroup v2 `cpu.max` quota)
  and keeps llama.cpp's own rule: half of them for generation, all of
  them for prompt batches.
- `ExtraBufts` is what a user may ask for: `auto` (the fast path, turned
  off by the supervisor after a crash), `on` or `off`.
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

ExtraBufts = Literal["auto", "on", "off"]

#: The values `--extra-bufts` accepts, in the order the help text lists them.
EXTRA_BUFTS_CHOICES: tuple[ExtraBufts, ...] = ("auto", "on", "off")

#: Signals by which a CPU code path (not the service or the kernel's OOM
#: killer) ends a worker: these, and only these, count as "the fast path
#: crashed" for the fallback.
CRASH_SIGNALS = frozenset(
    {signal.SIGSEGV, signal.SIGBUS, signal.SIGILL, signal.SIGFPE, signal.SIGABRT}
)

#: The prompt `self_check` decodes (any text the tokenizer takes will do):
#: long enough (about 50 tokens) that the batched matrix kernels run, not
#: only the single-row ones.
SELF_CHECK_TEXT = (
    "Hello! How are you today? Please tell me about the weather in Paris, "
    "the capital of France, and count from one to ten: one, two, three, four, "
    "five, six, seven, eight, nine, ten."
)

_patch_lock = threading.Lock()

#: Where Linux's cgroup v2 keeps this process's CPU quota ("max" or "QUOTA PERIOD").
CGROUP_CPU_MAX = Path("/sys/fs/cgroup/cpu.max")


def available_cpus(cpu_max: Path = CGROUP_CPU_MAX) -> int:
    """The number of cores this process may use (at least 1).

    The smaller of its CPU affinity mask (or `os.cpu_count()` where there
    is none) and a cgroup v2 quota read from `cpu_max` (`"max 100000"`: no
    quota; `"150000 100000"`: 2 cores, rounded up). An unreadable or
    malformed quota file counts as no quota.
    """
    try:
        count = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        count = os.cpu_count() or 1
    try:
        quota, period = cpu_max.read_text(encoding="ascii").split()[:2]
        if quota != "max" and int(period) > 0 and int(quota) > 0:
            count = min(count, math.ceil(int(quota) / int(period)))
    except (OSError, ValueError):
        pass
    return max(count, 1)


def default_threads(cpus: int | None = None) -> tuple[int, int]:
    """`(n_threads, n_threads_batch)` for llama.cpp: half the usable cores, and all of them.

    `cpus`: the usable cores (default `available_cpus()`).
    """
    usable = available_cpus() if cpus is None else max(cpus, 1)
    return max(usable // 2, 1), usable


def crash_signal(exitcode: int | None) -> signal.Signals | None:
    """The crash signal a process ended by, from its `multiprocessing` exit code.

    `exitcode` is negative for a process killed by a signal. Returns the
    signal when it is one of `CRASH_SIGNALS`, else `None` (a normal exit,
    `SIGKILL`, `SIGTERM`, or a process still running).
    """
    if exitcode is None or exitcode >= 0:
        return None
    try:
        sig = signal.Signals(-exitcode)
    except ValueError:
        return None
    return sig if sig in CRASH_SIGNALS else None


def model_params(*, extra_bufts: bool) -> Any:
    """llama.cpp's default model parameters for the CPU, with the extra buffer types on or off.

    No layers are offloaded to a GPU. Returns a `llama_cpp.llama_model_params`.
    """
    import llama_cpp

    params = llama_cpp.llama_model_default_params()
    params.n_gpu_layers = 0
    params.use_extra_bufts = extra_bufts
    return params


def load_model(model_path: str | Path, *, extra_bufts: bool) -> Any:
    """Load `model_path` as llama-cpp-python's low-level `LlamaModel` with `model_params`.

    Initializes llama.cpp's backend first. Raises `ValueError` (or another
    exception of llama-cpp-python) for a file it cannot load.
    """
    import llama_cpp
    from llama_cpp._internals import LlamaModel

    llama_cpp.llama_backend_init()
    return LlamaModel(
        path_model=str(model_path), params=model_params(extra_bufts=extra_bufts), verbose=False
    )


@contextlib.contextmanager
def extra_bufts_off() -> Iterator[None]:
    """Make `llama_model_default_params` return params with `use_extra_bufts` false."""
    import llama_cpp.llama_cpp as low

    with _patch_lock:
        original = low.llama_model_default_params

        def defaults() -> Any:
            params = original()
            params.use_extra_bufts = False
            return params

        low.llama_model_default_params = defaults
        try:
            yield
        finally:
            low.llama_model_default_params = original


def load_llama(model_path: str | Path, *, extra_bufts: bool, **kwargs: Any) -> Any:
    """Create a `llama_cpp.Llama` for `model_path` with or without the extra buffer types.

    `extra_bufts`: `True` keeps llama.cpp's default (the CPU's fast weight
    layouts), `False` turns them off. `kwargs` go to `Llama` unchanged
    (`n_ctx`, `n_threads`, `verbose`, ...). Raises `RuntimeError` when the
    extra buffer types were asked off and are still on, else what `Llama` raises
    (`ValueError` for a file it cannot load).
    """
    from llama_cpp import Llama

    if extra_bufts:
        return Llama(model_path=str(model_path), **kwargs)
    with extra_bufts_off():
        llama = Llama(model_path=str(model_path), **kwargs)
    if extra_bufts_in_use(llama):  # a llama-cpp-python that no longer reads the defaults there
        llama.close()
        raise RuntimeError("llama.cpp's CPU extra buffer types could not be turned off")
    return llama


def extra_bufts_in_use(llama: Any) -> bool:
    """Whether a model was loaded with the extra buffer types.

    `llama`: a `Llama` made by `load_llama` or a `LlamaModel` made by `load_model`.
    """
    params = llama.model_params if hasattr(llama, "model_params") else llama.params
    return bool(params.use_extra_bufts)


def self_check(llama: Any) -> None:
    """Decode `SELF_CHECK_TEXT`, then one more token, and clear the context again.

    A fast path that crashes does so here (the process dies by a signal).
    Raises `RuntimeError` when llama.cpp reports a decode failure.
    """
    tokens = llama.tokenize(SELF_CHECK_TEXT.encode("utf-8"), add_bos=True, special=False)
    tokens = tokens[: max(llama.n_ctx() - 2, 1)]  # a small context still fits the check
    if not tokens:
        raise RuntimeError("the model's tokenizer gave no tokens for the self-check")
    llama.reset()
    llama.eval(tokens)
    llama.eval(tokens[-1:])
    llama.reset()
    llama._ctx.kv_cache_clear()


def self_check_context(model: Any, context: Any, n_ctx: int) -> None:
    """Decode `SELF_CHECK_TEXT` in sequence 0 of `context`, then one more token; clear it again.

    `model`, `context`: llama-cpp-python's low-level `LlamaModel` and
    `LlamaContext`; `n_ctx`: tokens the sequence (and one batch) may hold
    (the prompt is cut to fit). A fast path that crashes does so here.
    Raises `RuntimeError` when llama.cpp reports a decode failure.
    """
    import llama_cpp

    tokens = model.tokenize(SELF_CHECK_TEXT.encode("utf-8"), add_bos=True, special=False)
    if not tokens:
        raise RuntimeError("the model's tokenizer gave no tokens for the self-check")
    tokens = tokens[: max(n_ctx - 1, 1)]
    memory = llama_cpp.llama_get_memory(context.ctx)
    batch = llama_cpp.llama_batch_init(len(tokens), 0, 1)
    try:
        for start, chunk in ((0, tokens), (len(tokens), tokens[-1:])):
            batch.n_tokens = len(chunk)
            for i, token in enumerate(chunk):
                batch.token[i] = token
                batch.pos[i] = start + i
                batch.n_seq_id[i] = 1
                batch.seq_id[i][0] = 0
                batch.logits[i] = i == len(chunk) - 1
            if llama_cpp.llama_decode(context.ctx, batch) != 0:
                raise RuntimeError("llama.cpp could not decode the self-check prompt")
    finally:
        llama_cpp.llama_batch_free(batch)
        llama_cpp.llama_memory_seq_rm(memory, 0, -1, -1)


def cpu_features() -> str:
    """llama.cpp's own one-line summary of the CPU features it uses (`AMX_INT8 = 1 | ...`)."""
    import llama_cpp

    raw = llama_cpp.llama_print_system_info()
    return raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)
