"""Export TinyChat from its GGUF to ONNX with a KV cache, for transformers.js.

Usage (from the repository root; needs torch, gguf, tokenizers, numpy, onnx,
onnxruntime and jinja2, see README.md in this folder)::

    python models/tinychat/onnx/export_onnx.py models/tinychat/tiny-chat-q8_0.gguf

Rules
- The GGUF is the single source: its tensors are dequantised (Q8_0 -> f32)
  into the PyTorch network of ``models/tinychat/model.py`` and its vocabulary
  and merges become ``tokenizer.json`` (byte-level BPE, GPT-2 split regex, no
  prefix space, the three specials as added tokens). Nothing else is read,
  so a retrained GGUF of the same architecture is re-exported by running this
  script again.
- The graph has the inputs and outputs transformers.js uses for a
  ``model_type: "llama"`` decoder with a KV cache: ``input_ids``,
  ``attention_mask``, ``position_ids`` and ``past_key_values.N.key/value``
  (batch, KV heads, past length, head size) in; ``logits`` and
  ``present.N.key/value`` (past length + new tokens) out. Batch, sequence and
  past lengths are dynamic. Rotary embeddings stay interleaved (llama.cpp's
  layout), computed from ``position_ids``.
- Before anything is written the export is checked: PyTorch greedy decoding
  of the dequantised weights and onnxruntime greedy decoding of the exported
  graph (token by token through the KV cache) must both reproduce
  ``out_ids`` of ``samples_torch.json`` (next to the GGUF) for every prompt,
  and the prompt token ids of the rebuilt tokenizer must equal its
  ``prompt_ids``. A mismatch stops the script with status 1.
- Written next to this script: ``config.json``, ``generation_config.json``,
  ``tokenizer.json``, ``tokenizer_config.json`` (with the GGUF's chat
  template), ``onnx/model.onnx``, ``export-info.json`` (sha256 of the source
  GGUF and the tool versions) and ``SHA256SUMS``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

HERE = Path(__file__).resolve().parent
TINYCHAT = HERE.parent
sys.path.insert(0, str(TINYCHAT))

from model import Config, Transformer  # noqa: E402

#: GGUF tensor name (after ``blk.N.``) -> model.py parameter (after ``layers.N.``).
LAYER_TENSORS = {
    "attn_norm": "attention_norm",
    "attn_q": "attention.wq",
    "attn_k": "attention.wk",
    "attn_v": "attention.wv",
    "attn_output": "attention.wo",
    "ffn_norm": "ffn_norm",
    "ffn_gate": "feed_forward.w1",
    "ffn_down": "feed_forward.w2",
    "ffn_up": "feed_forward.w3",
}
OPSET = 17
SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
OUTPUT_FILES = (
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "onnx/model.onnx",
)


def sha256_file(path: Path) -> str:
    """Hex sha256 of a file."""
    return hashlib.sha256(path.read_bytes()).hexdigest()


def read_gguf(path: Path) -> tuple[Config, dict[str, torch.Tensor], dict[str, Any]]:
    """The model shape, the dequantised state dict and the tokenizer fields of a GGUF."""
    from gguf import GGUFReader
    from gguf.quants import dequantize

    reader = GGUFReader(str(path))
    fields = reader.fields

    def scalar(key: str) -> Any:
        field = fields[key]
        return field.parts[field.data[0]].tolist()[0]

    def string(key: str) -> str:
        field = fields[key]
        return bytes(field.parts[field.data[0]]).decode()

    def strings(key: str) -> list[str]:
        field = fields[key]
        return [bytes(field.parts[i]).decode() for i in field.data]

    if string("general.architecture") != "llama":
        raise SystemExit("not a llama-architecture GGUF")
    tokens = strings("tokenizer.ggml.tokens")
    cfg = Config(
        vocab_size=len(tokens),
        dim=int(scalar("llama.embedding_length")),
        n_layers=int(scalar("llama.block_count")),
        n_heads=int(scalar("llama.attention.head_count")),
        n_kv_heads=int(scalar("llama.attention.head_count_kv")),
        hidden_dim=int(scalar("llama.feed_forward_length")),
        max_seq_len=int(scalar("llama.context_length")),
        norm_eps=float(scalar("llama.attention.layer_norm_rms_epsilon")),
        rope_theta=float(scalar("llama.rope.freq_base")),
    )
    weights: dict[str, np.ndarray] = {}
    for tensor in reader.tensors:
        array = dequantize(tensor.data, tensor.tensor_type).astype(np.float32)
        weights[tensor.name] = array.reshape([int(x) for x in reversed(tensor.shape.tolist())])
    state = {
        "tok_embeddings.weight": weights["token_embd.weight"],
        "norm.weight": weights["output_norm.weight"],
    }
    for name, array in weights.items():
        if name.startswith("blk."):
            _, index, rest = name.split(".", 2)
            state[f"layers.{index}.{LAYER_TENSORS[rest.rsplit('.', 1)[0]]}.weight"] = array
    # The output projection is tied to the embeddings (model.py); the GGUF's
    # explicit `output.weight` is the same matrix.
    state["output.weight"] = state["tok_embeddings.weight"]
    tok = {
        "tokens": tokens,
        "merges": strings("tokenizer.ggml.merges"),
        "chat_template": string("tokenizer.chat_template"),
        "bos": int(scalar("tokenizer.ggml.bos_token_id")),
        "eos": int(scalar("tokenizer.ggml.eos_token_id")),
        "pad": int(scalar("tokenizer.ggml.padding_token_id")),
    }
    return cfg, {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in state.items()}, tok


def build_tokenizer(tok: dict[str, Any]) -> Any:
    """A Hugging Face `tokenizers.Tokenizer` equal to the GGUF's (byte-level BPE)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    tokens: list[str] = tok["tokens"]
    merges = [tuple(m.split(" ")) for m in tok["merges"]]
    tokenizer = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in SPECIALS])
    return tokenizer


class KVDecoder(nn.Module):
    """TinyChat with a KV cache and transformers.js' llama input/output names.

    forward(input_ids (B, T) int64, attention_mask (B, P + T) int64,
    position_ids (B, T) int64, past_0_key, past_0_value, ... each
    (B, n_kv_heads, P, head_dim) float32) -> (logits (B, T, vocab),
    present_0_key, present_0_value, ... each (B, n_kv_heads, P + T, head_dim)).
    """

    def __init__(self, model: Transformer) -> None:
        super().__init__()
        self.m = model
        cfg = model.cfg
        self.hd = cfg.dim // cfg.n_heads
        self.n_heads, self.n_kv = cfg.n_heads, cfg.n_kv_heads
        freqs = 1.0 / (
            cfg.rope_theta ** (torch.arange(0, self.hd, 2, dtype=torch.float32) / self.hd)
        )
        self.register_buffer("freqs", freqs, persistent=False)

    def rope(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """Interleaved RoPE on x (B, T, H, hd) with cos/sin (B, T, 1, hd/2)."""
        b, t, h, d = x.shape
        pairs = x.reshape(b, t, h, d // 2, 2)
        x0, x1 = pairs[..., 0], pairs[..., 1]
        return torch.stack([x0 * cos - x1 * sin, x0 * sin + x1 * cos], dim=-1).reshape(b, t, h, d)

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        position_ids: torch.Tensor,
        *past: torch.Tensor,
    ) -> tuple[torch.Tensor, ...]:
        m = self.m
        b, t = input_ids.shape
        angles = position_ids.float()[..., None] * self.freqs  # (B, T, hd/2)
        cos, sin = angles.cos()[:, :, None, :], angles.sin()[:, :, None, :]
        # Key j is visible to query i when j <= i (absolute indices, counted
        # along the mask) and the mask keeps it.
        keep = attention_mask > 0
        key_index = torch.cumsum(torch.ones_like(attention_mask), dim=-1) - 1  # (B, P + T)
        query_index = key_index[:, -t:]
        visible = (key_index[:, None, :] <= query_index[:, :, None]) & keep[:, None, :]
        bias = torch.where(visible, 0.0, torch.finfo(torch.float32).min)[:, None, :, :]
        x = m.tok_embeddings(input_ids)
        presents: list[torch.Tensor] = []
        for index, layer in enumerate(m.layers):
            att = layer.attention
            h = layer.attention_norm(x)
            q = self.rope(att.wq(h).view(b, t, self.n_heads, self.hd), cos, sin).transpose(1, 2)
            k = self.rope(att.wk(h).view(b, t, self.n_kv, self.hd), cos, sin).transpose(1, 2)
            v = att.wv(h).view(b, t, self.n_kv, self.hd).transpose(1, 2)
            k = torch.cat([past[2 * index], k], dim=2)
            v = torch.cat([past[2 * index + 1], v], dim=2)
            presents += [k, v]
            if self.n_kv != self.n_heads:
                rep = self.n_heads // self.n_kv
                k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
            scores = q @ k.transpose(-1, -2) / (self.hd**0.5) + bias
            y = torch.softmax(scores, dim=-1) @ v
            x = x + att.wo(y.transpose(1, 2).reshape(b, t, -1))
            x = x + layer.feed_forward(layer.ffn_norm(x))
        logits = m.output(m.norm(x))
        return (logits, *presents)


def io_names(n_layers: int) -> tuple[list[str], list[str]]:
    """ONNX input and output names (transformers.js' llama decoder)."""
    past = [f"past_key_values.{i}.{kind}" for i in range(n_layers) for kind in ("key", "value")]
    present = [f"present.{i}.{kind}" for i in range(n_layers) for kind in ("key", "value")]
    return ["input_ids", "attention_mask", "position_ids", *past], ["logits", *present]


def export(decoder: KVDecoder, cfg: Config, path: Path) -> None:
    """Write the ONNX graph (TorchScript exporter, opset 17, one file)."""
    hd = cfg.dim // cfg.n_heads
    inputs, outputs = io_names(cfg.n_layers)
    ids = torch.tensor([[1, 2, 3]], dtype=torch.int64)
    past = [torch.zeros(1, cfg.n_kv_heads, 2, hd) for _ in range(2 * cfg.n_layers)]
    mask = torch.ones(1, 5, dtype=torch.int64)
    pos = torch.tensor([[2, 3, 4]], dtype=torch.int64)
    axes: dict[str, dict[int, str]] = {
        "input_ids": {0: "batch_size", 1: "sequence_length"},
        "attention_mask": {0: "batch_size", 1: "total_sequence_length"},
        "position_ids": {0: "batch_size", 1: "sequence_length"},
        "logits": {0: "batch_size", 1: "sequence_length"},
    }
    for name in inputs[3:]:
        axes[name] = {0: "batch_size", 2: "past_sequence_length"}
    for name in outputs[1:]:
        axes[name] = {0: "batch_size", 2: "total_sequence_length"}
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.onnx.export(
        decoder,
        (ids, mask, pos, *past),
        str(path),
        input_names=inputs,
        output_names=outputs,
        dynamic_axes=axes,
        opset_version=OPSET,
        dynamo=False,
        do_constant_folding=True,
    )


def ort_greedy(session: Any, cfg: Config, prompt: list[int], max_new: int, eos: int) -> list[int]:
    """Greedy decoding through the exported graph's KV cache (onnxruntime)."""
    hd = cfg.dim // cfg.n_heads
    names = [i.name for i in session.get_inputs()]
    past = {n: np.zeros((1, cfg.n_kv_heads, 0, hd), np.float32) for n in names[3:]}
    ids, out, total = list(prompt), [], 0
    for _ in range(max_new):
        step = ids if total == 0 else ids[-1:]
        feed = {
            "input_ids": np.array([step], np.int64),
            "attention_mask": np.ones((1, total + len(step)), np.int64),
            "position_ids": np.arange(total, total + len(step), dtype=np.int64)[None, :],
            **past,
        }
        result = session.run(None, feed)
        total += len(step)
        past = dict(zip(names[3:], result[1:], strict=True))
        token = int(result[0][0, -1].argmax())
        if token == eos:
            break
        ids.append(token)
        out.append(token)
    return out


def main(argv: list[str] | None = None) -> int:
    """Command line (module rules); returns the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("gguf", type=Path, help="the TinyChat GGUF to export")
    parser.add_argument(
        "--samples",
        type=Path,
        default=None,
        help="reference answers (default: samples_torch.json next to the GGUF)",
    )
    parser.add_argument("--out", type=Path, default=HERE, help="output folder (default: here)")
    args = parser.parse_args(argv)
    samples_path = args.samples or args.gguf.resolve().parent / "samples_torch.json"
    samples = json.loads(samples_path.read_text())
    torch.manual_seed(0)
    torch.set_num_threads(1)

    cfg, state, tok = read_gguf(args.gguf)
    model = Transformer(cfg).eval()
    model.load_state_dict(state, strict=True)
    tokenizer = build_tokenizer(tok)

    sys.path.insert(0, str(TINYCHAT))
    from gen_corpus import render

    failures = 0
    for sample in samples:
        prompt = tokenizer.encode(render(sample["messages"], add_generation_prompt=True)).ids
        if prompt != sample["prompt_ids"]:
            print("tokenizer mismatch:", sample["text"][:40])
            failures += 1
        got = model.greedy(sample["prompt_ids"], len(sample["out_ids"]) + 8, stop_ids=(tok["eos"],))
        if got != sample["out_ids"]:
            print("torch mismatch:", sample["text"][:40])
            failures += 1
    if failures:
        return 1
    print(f"torch (dequantised GGUF): {len(samples)}/{len(samples)} equal {samples_path.name}")

    import onnx
    import onnxruntime as ort

    out: Path = args.out
    with tempfile.TemporaryDirectory() as tmp:
        staged = Path(tmp) / "model.onnx"
        with torch.no_grad():
            export(KVDecoder(model).eval(), cfg, staged)
        onnx.checker.check_model(str(staged))
        session = ort.InferenceSession(str(staged), providers=["CPUExecutionProvider"])
        for sample in samples:
            got = ort_greedy(
                session, cfg, sample["prompt_ids"], len(sample["out_ids"]) + 8, tok["eos"]
            )
            if got != sample["out_ids"]:
                print("onnxruntime mismatch:", sample["text"][:40], got)
                failures += 1
        if failures:
            return 1
        print(f"onnxruntime (KV cache): {len(samples)}/{len(samples)} equal {samples_path.name}")
        (out / "onnx").mkdir(parents=True, exist_ok=True)
        (out / "onnx" / "model.onnx").write_bytes(staged.read_bytes())

    hd = cfg.dim // cfg.n_heads
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.dim,
        "intermediate_size": cfg.hidden_dim,
        "num_hidden_layers": cfg.n_layers,
        "num_attention_heads": cfg.n_heads,
        "num_key_value_heads": cfg.n_kv_heads,
        "head_dim": hd,
        "max_position_embeddings": cfg.max_seq_len,
        "rms_norm_eps": cfg.norm_eps,
        "rope_theta": cfg.rope_theta,
        "tie_word_embeddings": True,
        "hidden_act": "silu",
        "bos_token_id": tok["bos"],
        "eos_token_id": tok["eos"],
        "pad_token_id": tok["pad"],
        "torch_dtype": "float32",
        "transformers.js_config": {"dtype": "fp32", "use_external_data_format": False},
    }
    generation = {
        "bos_token_id": tok["bos"],
        "eos_token_id": tok["eos"],
        "pad_token_id": tok["pad"],
        "do_sample": False,
        "max_length": cfg.max_seq_len,
    }
    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": tok["tokens"][tok["bos"]],
        "eos_token": tok["tokens"][tok["eos"]],
        "pad_token": tok["tokens"][tok["pad"]],
        "add_bos_token": False,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": cfg.max_seq_len,
        "chat_template": tok["chat_template"],
    }

    def dump(name: str, value: Any) -> None:
        (out / name).write_text(json.dumps(value, indent=1, ensure_ascii=False) + "\n")

    dump("config.json", config)
    dump("generation_config.json", generation)
    dump("tokenizer_config.json", tokenizer_config)
    tokenizer.save(str(out / "tokenizer.json"))
    dump(
        "export-info.json",
        {
            "source": args.gguf.name,
            "source_sha256": sha256_file(args.gguf),
            "opset": OPSET,
            "torch": torch.__version__,
            "onnx": onnx.__version__,
            "onnxruntime": ort.__version__,
        },
    )
    sums = "".join(f"{sha256_file(out / name)}  {name}\n" for name in OUTPUT_FILES)
    (out / "SHA256SUMS").write_text(sums)
    size = (out / "onnx" / "model.onnx").stat().st_size
    print(f"wrote {out} (onnx/model.onnx: {size:,} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
