"""llama.cpp for tests, run the way the product runs it: in a process of its own.

A test that needs llama-cpp-python's answers never loads a model into the
pytest process: a crash inside llama.cpp (a CPU fast path that faults, as
AMX did on Intel Xeons) would end the whole run. `run_llama` runs a
module-level function in a `spawn` process, with the model loaded through
the product's `llama_load.load_llama`, and follows the service's `auto`
rule: the CPU fast path first, and without it after a crash signal (the
verdict is kept for the rest of the session). A crash without the fast
path, or a worker that hangs, fails only the calling test, with a message
that says so.
"""

from __future__ import annotations

import multiprocessing
import traceback
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

import pytest

#: Seconds a llama.cpp worker of a test may run.
TIMEOUT_S = 600.0

#: `None` until a run decided it; then whether the fast path is usable here.
_fast_path_ok: bool | None = None


def _child(
    conn: Connection, fn: Callable[..., Any], extra_bufts: bool, args: tuple[Any, ...]
) -> None:
    try:
        conn.send(("ok", fn(extra_bufts, *args)))
    except BaseException:  # reported to the test, which fails with it
        conn.send(("error", traceback.format_exc()))
    finally:
        conn.close()


def _run_once(fn: Callable[..., Any], extra_bufts: bool, args: tuple[Any, ...]) -> tuple[str, Any]:
    ctx = multiprocessing.get_context("spawn")
    parent, child = ctx.Pipe(duplex=False)
    process = ctx.Process(target=_child, args=(child, fn, extra_bufts, args), daemon=True)
    process.start()
    child.close()
    try:
        if parent.poll(TIMEOUT_S):
            try:
                return parent.recv()
            except EOFError:
                pass
        else:
            process.kill()
            process.join(5)
            return ("hung", None)
    finally:
        parent.close()
    process.join(10)
    return ("died", process.exitcode)


def run_llama(fn: Callable[..., Any], *args: Any) -> Any:
    """`fn(extra_bufts, *args)` in a llama.cpp worker process; its (picklable) result.

    `fn` is a module-level function that loads the model with
    `load_llama(..., extra_bufts=extra_bufts)`. Fails the calling test
    (never the session) when the worker crashes, hangs or raises.
    """
    from napllm.lmsp_service.llama_load import crash_signal

    global _fast_path_ok
    extra_bufts = _fast_path_ok is not False
    status, value = _run_once(fn, extra_bufts, args)
    if status == "died" and extra_bufts and crash_signal(value) is not None:
        _fast_path_ok = False
        status, value = _run_once(fn, False, args)
    elif status == "ok" and extra_bufts:
        _fast_path_ok = True
    if status == "ok":
        return value
    if status == "error":
        pytest.fail(f"the llama.cpp worker raised:\n{value}")
    if status == "hung":
        pytest.fail(f"the llama.cpp worker did not finish within {TIMEOUT_S:.0f} s")
    sig = crash_signal(value)
    what = sig.name if sig is not None else f"exit status {value}"
    pytest.fail(
        f"llama.cpp crashed in its worker process ({what}), even with the CPU fast path off; "
        "the rest of the run goes on"
    )


# --------------------------------------------------------------------------- workers


def greedy_tokens(
    extra_bufts: bool, model: str, prompts: list[list[int]], max_new: int, eos: int
) -> list[tuple[list[int], str]]:
    """Greedy output (token ids, text) for each prompt (token ids), to `eos` or `max_new`."""
    from napllm.lmsp_service.llama_load import load_llama

    llm = load_llama(model, extra_bufts=extra_bufts, n_ctx=512, n_threads=1, verbose=False)
    try:
        answers = []
        for prompt in prompts:
            tokens: list[int] = []
            for token in llm.generate(prompt, temp=0.0, top_k=1, reset=True):
                if token == eos or len(tokens) >= max_new:
                    break
                tokens.append(int(token))
            answers.append((tokens, llm.detokenize(tokens).decode("utf-8")))
        return answers
    finally:
        llm.close()


def chat_answers(
    extra_bufts: bool, model: str, conversations: list[list[dict[str, Any]]], max_tokens: int
) -> list[str]:
    """Greedy `create_chat_completion` text for each conversation (the GGUF's template)."""
    from napllm.lmsp_service.llama_load import load_llama

    llm = load_llama(model, extra_bufts=extra_bufts, n_ctx=512, n_threads=1, verbose=False)
    try:
        out = []
        for messages in conversations:
            answer = llm.create_chat_completion(
                messages=messages, max_tokens=max_tokens, temperature=0.0, top_k=1
            )
            out.append(answer["choices"][0]["message"]["content"])
        return out
    finally:
        llm.close()
