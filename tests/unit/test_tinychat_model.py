"""The committed TinyChat model is the one its README and SHA256SUMS describe.

Checks the file's sha256, then reads the GGUF metadata: with the ``gguf``
package when it is installed, else with the small reader below (the GGUF v3
layout: magic, version, tensor count, key/value count, then typed key/value
pairs). The reader is ours because the test must not need ``gguf`` (and its
numpy) in CI; it is checked against hand-made files and, when ``gguf`` is
present, against ``gguf`` itself.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import re
import struct
from pathlib import Path
from types import ModuleType
from typing import Any, BinaryIO

import pytest

from llama_isolated import chat_answers, run_llama

ROOT = Path(__file__).resolve().parents[2]
MODEL_DIR = ROOT / "models" / "tinychat"
MODEL = MODEL_DIR / "tiny-chat-q8_0.gguf"

GGUF_MAGIC = b"GGUF"
# GGUF value types -> struct format of the scalar types.
SCALARS = {
    0: "B",
    1: "b",
    2: "H",
    3: "h",
    4: "I",
    5: "i",
    6: "f",
    7: "?",
    10: "Q",
    11: "q",
    12: "d",
}
STRING, ARRAY = 8, 9


class GGUFError(ValueError):
    """The bytes are not a GGUF file this reader understands."""


def _read(f: BinaryIO, n: int) -> bytes:
    data = f.read(n)
    if len(data) != n:
        raise GGUFError("truncated GGUF file")
    return data


def _unpack(f: BinaryIO, fmt: str) -> Any:
    return struct.unpack("<" + fmt, _read(f, struct.calcsize("<" + fmt)))[0]


def _string(f: BinaryIO) -> str:
    return _read(f, _unpack(f, "Q")).decode("utf-8")


def _value(f: BinaryIO, kind: int) -> Any:
    if kind in SCALARS:
        return _unpack(f, SCALARS[kind])
    if kind == STRING:
        return _string(f)
    if kind == ARRAY:
        item_kind, count = _unpack(f, "I"), _unpack(f, "Q")
        return [_value(f, item_kind) for _ in range(count)]
    raise GGUFError(f"unknown GGUF value type {kind}")


def read_gguf_header(path: Path) -> tuple[int, int, dict[str, Any]]:
    """Return (version, tensor count, metadata) of a little-endian GGUF file.

    Raises: GGUFError for a wrong magic, an unknown value type or a short file.
    """
    with path.open("rb") as f:
        if _read(f, 4) != GGUF_MAGIC:
            raise GGUFError("not a GGUF file (bad magic)")
        version = _unpack(f, "I")
        n_tensors, n_kv = _unpack(f, "Q"), _unpack(f, "Q")
        metadata = {}
        for _ in range(n_kv):
            key = _string(f)
            metadata[key] = _value(f, _unpack(f, "I"))
    return version, n_tensors, metadata


def read_with_gguf_package(path: Path) -> tuple[int, int, dict[str, Any]]:
    """The same triple, read by the ``gguf`` package."""
    import gguf  # type: ignore[import-not-found, unused-ignore]

    reader = gguf.GGUFReader(str(path))
    metadata = {}
    for name, field in reader.fields.items():
        if name.startswith("GGUF."):
            continue
        metadata[name] = field.contents()
    version = int(reader.fields["GGUF.version"].parts[-1][0])
    return version, len(reader.tensors), metadata


def read_model() -> tuple[int, int, dict[str, Any]]:
    if importlib.util.find_spec("gguf") is not None:
        return read_with_gguf_package(MODEL)
    return read_gguf_header(MODEL)


def load_gen_corpus() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "tinychat_gen_corpus", MODEL_DIR / "gen_corpus.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# --------------------------------------------------------------------------- tests


def test_checksum_matches_sha256sums() -> None:
    lines = (MODEL_DIR / "SHA256SUMS").read_text().splitlines()
    sums: dict[str, str] = {}
    for line in lines:
        if line.strip():
            digest, name = line.split(maxsplit=1)
            sums[name.lstrip("*")] = digest
    assert set(sums) == {MODEL.name}
    assert hashlib.sha256(MODEL.read_bytes()).hexdigest() == sums[MODEL.name]


def test_model_is_gguf_v3_llama_with_chatml_template() -> None:
    version, n_tensors, meta = read_model()
    assert version == 3
    # token_embd, output_norm, output + 9 tensors in each of 4 blocks
    assert n_tensors == 3 + 9 * 4
    assert meta["general.architecture"] == "llama"
    assert meta["llama.block_count"] == 4
    assert meta["llama.embedding_length"] == 128
    assert meta["llama.context_length"] == 512
    assert meta["tokenizer.ggml.model"] == "gpt2"
    assert meta["tokenizer.ggml.pre"] == "gpt-2"
    tokens = meta["tokenizer.ggml.tokens"]
    assert len(tokens) == 1024
    assert tokens[:3] == ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    assert meta["tokenizer.ggml.eos_token_id"] == tokens.index("<|im_end|>")
    template = meta["tokenizer.chat_template"]
    assert "<|im_start|>" in template and "<|im_end|>" in template
    assert "add_generation_prompt" in template
    # The template in the file is the recipe's template, byte for byte.
    assert template == load_gen_corpus().CHAT_TEMPLATE


def test_chat_template_renders_chatml() -> None:
    jinja2 = pytest.importorskip("jinja2")
    template = read_model()[2]["tokenizer.chat_template"]
    messages = [
        {"role": "system", "content": "You are TinyChat."},
        {"role": "user", "content": "Hello!"},
    ]
    text = (
        jinja2.Environment()
        .from_string(template)
        .render(messages=messages, add_generation_prompt=True)
    )
    assert text == (
        "<|im_start|>system\nYou are TinyChat.<|im_end|>\n"
        "<|im_start|>user\nHello!<|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def _gguf_bytes(kv: list[tuple[str, int, bytes]], version: int = 3) -> bytes:
    out = GGUF_MAGIC + struct.pack("<IQQ", version, 0, len(kv))
    for key, kind, payload in kv:
        out += struct.pack("<Q", len(key)) + key.encode() + struct.pack("<I", kind) + payload
    return out


def _gguf_str(s: str) -> bytes:
    return struct.pack("<Q", len(s.encode())) + s.encode()


def test_reader_reads_every_value_kind(tmp_path: Path) -> None:
    path = tmp_path / "m.gguf"
    path.write_bytes(
        _gguf_bytes(
            [
                ("a.u32", 4, struct.pack("<I", 7)),
                ("a.f32", 6, struct.pack("<f", 0.5)),
                ("a.bool", 7, b"\x01"),
                ("a.str", STRING, _gguf_str("héllo")),
                ("a.arr", ARRAY, struct.pack("<IQ", STRING, 2) + _gguf_str("x") + _gguf_str("")),
                ("a.i64", 11, struct.pack("<q", -3)),
            ]
        )
    )
    assert read_gguf_header(path) == (
        3,
        0,
        {
            "a.u32": 7,
            "a.f32": 0.5,
            "a.bool": True,
            "a.str": "héllo",
            "a.arr": ["x", ""],
            "a.i64": -3,
        },
    )


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"GGML" + bytes(20), "bad magic"),
        (b"GGUF\x03\x00", "truncated"),
        (_gguf_bytes([("k", 99, b"")]), "unknown GGUF value type 99"),
        (_gguf_bytes([("k", STRING, struct.pack("<Q", 10) + b"abc")]), "truncated"),
    ],
)
def test_reader_rejects_bad_files(tmp_path: Path, data: bytes, message: str) -> None:
    path = tmp_path / "bad.gguf"
    path.write_bytes(data)
    with pytest.raises(GGUFError, match=message):
        read_gguf_header(path)


def test_own_reader_agrees_with_gguf_package() -> None:
    pytest.importorskip("gguf")
    ours, theirs = read_gguf_header(MODEL), read_with_gguf_package(MODEL)
    assert ours[:2] == theirs[:2]
    for key in ("general.architecture", "tokenizer.chat_template", "tokenizer.ggml.tokens"):
        assert ours[2][key] == theirs[2][key]


def test_readme_lists_the_known_cities_and_names() -> None:
    corpus = load_gen_corpus()
    readme = (MODEL_DIR / "README.md").read_text()
    words = set(re.findall(r"[A-Z][a-z]+", readme))
    assert set(corpus.CITIES) <= words
    assert set(corpus.NAMES) <= words
    assert len(set(corpus.CITIES)) == 45
    assert len(corpus.NAMES) == 32


def test_llama_cpp_answers_match_the_reference_samples() -> None:
    """llama.cpp (llama-cpp-python) gives PyTorch's greedy answers on the q8_0 file.

    Covers every prompt of `samples_torch.json`, among them the long answer
    the benchmarks use ("Count from 1 to 100.", 200 tokens): the committed
    model answers exactly what its recipe's reference says.
    """
    pytest.importorskip("llama_cpp")

    samples = json.loads((MODEL_DIR / "samples_torch.json").read_text())
    answers = run_llama(chat_answers, str(MODEL), [sample["messages"] for sample in samples], 400)
    for sample, answer in zip(samples, answers, strict=True):
        assert answer == sample["text"], sample["messages"]


def test_long_answer_is_long_and_fits_the_context() -> None:
    """The count answer is at least 200 tokens and, with its prompt, fits 512."""

    corpus = load_gen_corpus()
    answer: str = corpus.COUNT_A
    assert answer == ", ".join(str(i) for i in range(1, 101)) + "."
    samples = json.loads((MODEL_DIR / "samples_torch.json").read_text())
    (count,) = [s for s in samples if s["messages"][-1]["content"] == "Count from 1 to 100."]
    assert count["text"] == answer
    assert len(count["out_ids"]) >= 200
    assert len(count["prompt_ids"]) + len(count["out_ids"]) + 1 <= 512
