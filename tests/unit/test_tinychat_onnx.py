"""The committed ONNX export of TinyChat (models/tinychat/onnx/) is the GGUF's.

- Every exported file matches ``SHA256SUMS``, and ``export-info.json`` names
  the sha256 of the committed GGUF: a retrained GGUF without a re-export fails
  here, with the command that re-exports.
- The graph has transformers.js' llama decoder inputs and outputs.
- Greedy decoding of the graph through its KV cache (onnxruntime, CPU) gives
  exactly llama.cpp's greedy tokens for every prompt of ``samples_torch.json``
  on the committed GGUF (llama-cpp-python), and the recorded ``out_ids``.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from llama_isolated import greedy_tokens, run_llama

ROOT = Path(__file__).resolve().parents[2]
TINYCHAT = ROOT / "models" / "tinychat"
ONNX_DIR = TINYCHAT / "onnx"
GGUF = TINYCHAT / "tiny-chat-q8_0.gguf"
SAMPLES = json.loads((TINYCHAT / "samples_torch.json").read_text())
REEXPORT = f"python models/tinychat/onnx/export_onnx.py models/tinychat/{GGUF.name}"
EOS = 2
MAX_NEW = 256  # the long counting answer is 200 tokens


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_files_match_sha256sums() -> None:
    sums = {}
    for line in (ONNX_DIR / "SHA256SUMS").read_text().splitlines():
        digest, name = line.split(maxsplit=1)
        sums[name.lstrip("*")] = digest
    assert set(sums) == {
        "config.json",
        "generation_config.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "onnx/model.onnx",
    }
    for name, digest in sums.items():
        assert sha256(ONNX_DIR / name) == digest, name


def test_export_is_of_the_committed_gguf() -> None:
    info = json.loads((ONNX_DIR / "export-info.json").read_text())
    assert info["source_sha256"] == sha256(GGUF), f"the GGUF changed: re-export with {REEXPORT}"


def test_config_and_template() -> None:
    config = json.loads((ONNX_DIR / "config.json").read_text())
    assert config["model_type"] == "llama"
    assert config["eos_token_id"] == EOS
    assert config["transformers.js_config"]["dtype"] == "fp32"
    tok = json.loads((ONNX_DIR / "tokenizer_config.json").read_text())
    assert tok["eos_token"] == "<|im_end|>"
    assert "<tool_call>" in tok["chat_template"]


@pytest.fixture(scope="module")
def session() -> Any:
    ort = pytest.importorskip("onnxruntime")
    return ort.InferenceSession(
        str(ONNX_DIR / "onnx" / "model.onnx"), providers=["CPUExecutionProvider"]
    )


def test_io_names_are_transformers_js_llama(session: Any) -> None:
    config = json.loads((ONNX_DIR / "config.json").read_text())
    layers = config["num_hidden_layers"]
    kinds = ("key", "value")
    past = [f"past_key_values.{i}.{k}" for i in range(layers) for k in kinds]
    present = [f"present.{i}.{k}" for i in range(layers) for k in kinds]
    assert [i.name for i in session.get_inputs()] == [
        "input_ids",
        "attention_mask",
        "position_ids",
        *past,
    ]
    assert [o.name for o in session.get_outputs()] == ["logits", *present]


def ort_greedy(session: Any, prompt: list[int]) -> list[int]:
    """Greedy ids through the KV cache, prompt first, then one token a step."""
    import numpy as np

    config = json.loads((ONNX_DIR / "config.json").read_text())
    shape = (1, config["num_key_value_heads"], 0, config["head_dim"])
    names = [i.name for i in session.get_inputs()][3:]
    past = {n: np.zeros(shape, np.float32) for n in names}
    ids, out, total = list(prompt), [], 0
    for _ in range(MAX_NEW):
        step = ids if total == 0 else ids[-1:]
        result = session.run(
            None,
            {
                "input_ids": np.array([step], np.int64),
                "attention_mask": np.ones((1, total + len(step)), np.int64),
                "position_ids": np.arange(total, total + len(step), dtype=np.int64)[None, :],
                **past,
            },
        )
        total += len(step)
        past = dict(zip(names, result[1:], strict=True))
        token = int(result[0][0, -1].argmax())
        if token == EOS:
            break
        ids.append(token)
        out.append(token)
    return out


@pytest.fixture(scope="module")
def llama_greedy() -> list[list[int]]:
    pytest.importorskip("llama_cpp")
    answers = run_llama(
        greedy_tokens, str(GGUF), [sample["prompt_ids"] for sample in SAMPLES], MAX_NEW, EOS
    )
    return [tokens for tokens, _text in answers]


def test_greedy_tokens_equal_llama_cpp(session: Any, llama_greedy: list[list[int]]) -> None:
    got = [ort_greedy(session, s["prompt_ids"]) for s in SAMPLES]
    assert got == llama_greedy
    assert got == [s["out_ids"] for s in SAMPLES]
