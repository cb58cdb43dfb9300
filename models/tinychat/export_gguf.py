"""Write the trained TinyChat model to a llama-architecture GGUF file (``gguf`` writer API).

Rules
- Metadata: ``general.architecture = llama`` and the llama shape keys; the
  tokenizer as GPT-2 style byte-level BPE (``tokenizer.ggml.model = gpt2``,
  ``tokenizer.ggml.pre = gpt-2``, the spelling llama.cpp accepts for the GPT-2
  split regex), token list in GPT-2 byte-to-unicode form, token types
  (CONTROL for the 3 special tokens), merges, BOS/PAD ``<|endoftext|>``,
  EOS/EOT ``<|im_end|>``, no automatic BOS/EOS, and the ChatML
  ``tokenizer.chat_template`` from gen_corpus.py.
- Tensors: ``token_embd``, ``output_norm``, ``output`` (written although tied)
  and ``blk.N.{attn_norm, attn_q, attn_k, attn_v, attn_output, ffn_norm,
  ffn_gate, ffn_up, ffn_down}.weight``; norms are always F32, the rest F32,
  F16 or Q8_0 (``gguf.quants.quantize``).

Usage: ``python export_gguf.py [--src out] [--type q8_0] [--dst FILE]`` (default
``<src>/tiny-chat-<type>.gguf``). The committed model is ``--type q8_0``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import gguf
import numpy as np
import torch
from gen_corpus import CHAT_TEMPLATE, SPECIAL_TOKENS

GLOBAL_TENSORS = {
    "tok_embeddings.weight": "token_embd.weight",
    "norm.weight": "output_norm.weight",
    "output.weight": "output.weight",
}
LAYER_TENSORS = {
    "attention_norm.weight": "attn_norm.weight",
    "attention.wq.weight": "attn_q.weight",
    "attention.wk.weight": "attn_k.weight",
    "attention.wv.weight": "attn_v.weight",
    "attention.wo.weight": "attn_output.weight",
    "ffn_norm.weight": "ffn_norm.weight",
    "feed_forward.w1.weight": "ffn_gate.weight",
    "feed_forward.w3.weight": "ffn_up.weight",
    "feed_forward.w2.weight": "ffn_down.weight",
}
FILE_TYPES = {
    "f32": gguf.LlamaFileType.ALL_F32,
    "f16": gguf.LlamaFileType.MOSTLY_F16,
    "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0,
}


def gguf_tensor_name(name: str) -> str:
    """GGUF name of a PyTorch state-dict key (``layers.2.attention.wq.weight`` -> ...)."""
    if name.startswith("layers."):
        _, index, rest = name.split(".", 2)
        return f"blk.{index}.{LAYER_TENSORS[rest]}"
    return GLOBAL_TENSORS[name]


def main() -> None:
    """Command line entry point (see the module docstring)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--src", type=Path, default=Path("out"))
    ap.add_argument("--dst", type=Path, default=None)
    ap.add_argument("--type", default="q8_0", choices=sorted(FILE_TYPES))
    a = ap.parse_args()
    dst = a.dst or a.src / f"tiny-chat-{a.type}.gguf"
    ck = torch.load(a.src / "model.pt", map_location="cpu")
    cfg, state = ck["config"], ck["state_dict"]
    tj = json.loads((a.src / "tokenizer.json").read_text())

    # Vocabulary in id order; the strings are already in GPT-2 byte-to-unicode form.
    vocab = dict(tj["model"]["vocab"])
    for t in tj["added_tokens"]:
        vocab[t["content"]] = t["id"]
    n_vocab = max(vocab.values()) + 1
    if n_vocab != cfg["vocab_size"]:
        raise SystemExit(f"tokenizer has {n_vocab} tokens, model {cfg['vocab_size']}")
    by_id: dict[int, str] = {i: s for s, i in vocab.items()}
    if sorted(by_id) != list(range(n_vocab)):
        raise SystemExit("tokenizer ids are not contiguous")
    tokens = [by_id[i] for i in range(n_vocab)]
    types = [
        gguf.TokenType.CONTROL if t in SPECIAL_TOKENS else gguf.TokenType.NORMAL for t in tokens
    ]
    merges = [m if isinstance(m, str) else " ".join(m) for m in tj["model"]["merges"]]

    w = gguf.GGUFWriter(str(dst), "llama")
    w.add_name("tiny-chat-test")
    w.add_context_length(cfg["max_seq_len"])
    w.add_embedding_length(cfg["dim"])
    w.add_block_count(cfg["n_layers"])
    w.add_feed_forward_length(cfg["hidden_dim"])
    w.add_head_count(cfg["n_heads"])
    w.add_head_count_kv(cfg["n_kv_heads"])
    w.add_layer_norm_rms_eps(cfg["norm_eps"])
    w.add_rope_freq_base(cfg["rope_theta"])
    w.add_rope_dimension_count(cfg["dim"] // cfg["n_heads"])
    w.add_vocab_size(n_vocab)
    w.add_file_type(FILE_TYPES[a.type])

    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt-2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(vocab["<|endoftext|>"])
    w.add_eos_token_id(vocab["<|im_end|>"])
    w.add_eot_token_id(vocab["<|im_end|>"])
    w.add_pad_token_id(vocab["<|endoftext|>"])
    w.add_add_bos_token(False)
    w.add_add_eos_token(False)
    w.add_chat_template(CHAT_TEMPLATE)

    for key, value in state.items():
        name = gguf_tensor_name(key)
        arr = value.detach().float().numpy()
        if arr.ndim == 1 or a.type == "f32":
            w.add_tensor(name, arr.astype(np.float32))  # norms always F32
        elif a.type == "f16":
            w.add_tensor(name, arr.astype(np.float16))
        else:
            q = gguf.quants.quantize(arr, gguf.GGMLQuantizationType.Q8_0)
            w.add_tensor(name, q, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(dst, dst.stat().st_size, "bytes")


if __name__ == "__main__":
    main()
