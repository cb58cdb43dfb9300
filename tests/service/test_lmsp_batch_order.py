"""The order in which a decoding step lists its sequences (batching.py).

Each sequence has KV cells of its own (`kv_unified` off), and llama.cpp
then decodes one pass per run of increasing, consecutive sequence ids in the
order the batch lists them, reading every weight again for each pass. A
batch listed in arrival order (a later generation on a lower sequence id)
cost 1.5x the CPU per token at four and more clients, so every step must
list its sequences by increasing id.

The runner is driven in this process with TinyChat, and every batch
handed to `llama_decode` is recorded.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest

pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed")

import llama_cpp
from tests.service.conftest import MODEL

from napllm.lmsp_service.batch_load import load_batching_model
from napllm.lmsp_service.batching import BatchRunner, EndUpdate

pytestmark = pytest.mark.service


class RecordingLlama:
    """llama_cpp, except that `llama_decode` records the sequence ids of each batch."""

    def __init__(self) -> None:
        self.batches: list[list[int]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(llama_cpp, name)

    def llama_decode(self, ctx: Any, batch: Any) -> int:
        self.batches.append([batch.seq_id[i][0] for i in range(batch.n_tokens)])
        return llama_cpp.llama_decode(ctx, batch)


def job(runner: BatchRunner, text: str, max_tokens: int) -> dict[str, Any]:
    vocab = runner._vocab  # the runner's own vocabulary
    data = text.encode()
    ids = (llama_cpp.llama_token * 64)()
    n = llama_cpp.llama_tokenize(vocab, data, len(data), ids, 64, True, True)
    return {
        "prompt_tokens": list(ids[:n]),
        "max_tokens": max_tokens,
        "grammar": None,
        "temperature": 0.0,
        "min_output_tokens": max_tokens,  # exactly max_tokens tokens
        "prompt_reuse": True,
    }


def test_every_step_lists_its_sequences_by_increasing_id() -> None:
    loaded = load_batching_model(str(MODEL), 256, 4, 1, False)
    ended: list[int] = []
    runner = BatchRunner(
        loaded, lambda updates: ended.extend(u.rid for u in updates if isinstance(u, EndUpdate))
    )
    recording = RecordingLlama()
    runner._ll = recording  # observe the calls, change nothing
    # Four generations take sequences 0..3; the first ends early, and a
    # fifth arrives and takes its sequence 0, behind the three others.
    runner.add(0, job(runner, "Hi", 2), threading.Event())
    for rid in (1, 2, 3):
        runner.add(rid, job(runner, "Tell me a joke.", 40), threading.Event())
    while 0 not in ended:
        runner.step()
    runner.add(4, job(runner, "Hello!", 20), threading.Event())
    first_of_fifth = len(recording.batches)
    while not runner.idle:
        runner.step()
    assert sorted(ended) == [0, 1, 2, 3, 4]
    later = recording.batches[first_of_fifth:]
    assert any(0 in ids and len(set(ids)) == 4 for ids in later)  # the fifth joined the others
    for ids in recording.batches:
        assert ids == sorted(ids), f"a batch lists sequences out of order: {ids}"
