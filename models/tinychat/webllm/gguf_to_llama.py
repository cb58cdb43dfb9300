"""TinyChat's GGUF -> a Hugging Face Llama checkpoint (safetensors), for mlc-llm.

Usage (from the repository root; needs numpy, gguf and safetensors)::

    python models/tinychat/webllm/gguf_to_llama.py models/tinychat/tiny-chat-q8_0.gguf OUT

Rules
- The GGUF is the only source of weights: every tensor is dequantised to
  float32 (Q8_0 -> f32) with ``gguf``'s own dequantiser. The tokenizer files
  and ``config.json`` come from ``models/tinychat/onnx/`` (built from the same
  GGUF by ``export_onnx.py``), without the transformers.js block.
- TinyChat rotates query/key features in adjacent pairs (llama.cpp's
  ``LLAMA_ROPE_TYPE_NORM``, ``models/tinychat/model.py``), while mlc-llm's
  ``llama`` model reads Hugging Face's layout, which rotates feature ``i``
  with feature ``i + head_dim/2``. Re-ordering the output rows of ``q`` and
  ``k`` inside each head (even features first, then odd ones) turns one
  into the other: :func:`pairs_to_halves`.
- The output projection is tied to the embeddings (``output.weight`` equals
  ``token_embd.weight``): the checkpoint has no ``lm_head.weight``; a GGUF
  whose two matrices differ is refused.
- ``model.safetensors.index.json`` is written too: mlc-llm then reads the
  checkpoint without importing PyTorch.
- Nothing is written unless :func:`reference.greedy` on the converted
  weights reproduces ``out_ids`` of every prompt in ``samples_torch.json``.

Errors: ``SystemExit`` with a message for a GGUF that is not TinyChat's
shape or a conversion that does not reproduce the references.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
TINYCHAT = HERE.parent
sys.path.insert(0, str(HERE))

from reference import LlamaShape, greedy  # noqa: E402

#: GGUF per-layer tensor (after ``blk.N.``) -> Hugging Face name (after ``model.layers.N.``).
LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "generation_config.json")


def pairs_to_halves(weight: np.ndarray, heads: int) -> np.ndarray:
    """Rows of a q/k projection, (heads*head_dim, in), from pair-wise to half-split RoPE.

    Within each head, output row ``2j`` (the first of pair ``j``) moves to
    ``j`` and row ``2j+1`` to ``j + head_dim/2``.
    """
    rows, cols = weight.shape
    head_dim = rows // heads
    order = np.concatenate([np.arange(0, head_dim, 2), np.arange(1, head_dim, 2)])
    per_head = weight.reshape(heads, head_dim, cols)
    return np.ascontiguousarray(per_head[:, order, :].reshape(rows, cols))


def read_gguf(path: Path) -> tuple[LlamaShape, dict[str, np.ndarray]]:
    """The model shape and the float32 tensors (numpy layout: rows first) of a GGUF."""
    from gguf import GGUFReader
    from gguf.quants import dequantize

    reader = GGUFReader(str(path))

    def number(key: str) -> float:
        field = reader.fields[key]
        return field.parts[field.data[0]].tolist()[0]

    arch = reader.fields["general.architecture"]
    if bytes(arch.parts[arch.data[0]]).decode() != "llama":
        raise SystemExit(f"{path}: not a llama-architecture GGUF")
    tensors: dict[str, np.ndarray] = {}
    for tensor in reader.tensors:
        values = dequantize(tensor.data, tensor.tensor_type).astype(np.float32)
        tensors[tensor.name] = values.reshape([int(n) for n in tensor.shape.tolist()[::-1]])
    shape = LlamaShape(
        layers=int(number("llama.block_count")),
        heads=int(number("llama.attention.head_count")),
        kv_heads=int(number("llama.attention.head_count_kv")),
        hidden=int(number("llama.embedding_length")),
        eps=float(number("llama.attention.layer_norm_rms_epsilon")),
        rope_theta=float(number("llama.rope.freq_base")),
    )
    return shape, tensors


def to_hf(shape: LlamaShape, tensors: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Hugging Face Llama state dict (tied embeddings) from GGUF tensors."""
    embed = tensors["token_embd.weight"]
    output = tensors.get("output.weight")
    if output is not None and not np.array_equal(output, embed):
        raise SystemExit("output.weight differs from token_embd.weight: not a tied model")
    hf = {"model.embed_tokens.weight": embed, "model.norm.weight": tensors["output_norm.weight"]}
    for name, values in tensors.items():
        if not name.startswith("blk."):
            continue
        _, index, rest = name.split(".", 2)
        if rest == "attn_q.weight":
            values = pairs_to_halves(values, shape.heads)
        elif rest == "attn_k.weight":
            values = pairs_to_halves(values, shape.kv_heads)
        hf[f"model.layers.{index}.{LAYER_NAMES[rest]}"] = values
    return {k: np.ascontiguousarray(v, dtype=np.float32) for k, v in hf.items()}


def main(argv: list[str] | None = None) -> int:
    """Command line entry point (module docstring)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("gguf", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--samples", type=Path, default=TINYCHAT / "samples_torch.json")
    ap.add_argument("--tokenizer-dir", type=Path, default=TINYCHAT / "onnx")
    args = ap.parse_args(argv)
    from safetensors.numpy import save_file

    shape, tensors = read_gguf(args.gguf)
    hf = to_hf(shape, tensors)
    samples = json.loads(args.samples.read_text())
    for sample in samples:
        got = greedy(shape, hf, sample["prompt_ids"], len(sample["out_ids"]))
        if got != sample["out_ids"]:
            raise SystemExit(f"converted weights do not reproduce {sample['text'][:40]!r}")
    print(f"converted checkpoint reproduces {len(samples)}/{len(samples)} reference answers")
    args.out.mkdir(parents=True, exist_ok=True)
    save_file(hf, str(args.out / "model.safetensors"), metadata={"format": "pt"})
    index = {"metadata": {}, "weight_map": {name: "model.safetensors" for name in hf}}
    (args.out / "model.safetensors.index.json").write_text(json.dumps(index, indent=1))
    config = json.loads((args.tokenizer_dir / "config.json").read_text())
    config.pop("transformers.js_config", None)
    config["tie_word_embeddings"] = True
    (args.out / "config.json").write_text(json.dumps(config, indent=1))
    for name in TOKENIZER_FILES:
        if (args.tokenizer_dir / name).is_file():
            shutil.copyfile(args.tokenizer_dir / name, args.out / name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
