"""A numpy Llama forward pass in Hugging Face's layout, and a reader for WebLLM's weight shards.

Used by ``gguf_to_llama.py`` (the converted checkpoint must reproduce the
reference answers before it is written) and by
``tests/unit/test_tinychat_webllm.py`` (the shipped ``params_shard_*.bin``
must too). It is a check, not an engine: plain float32 numpy, the prompt at once,
then one token at a time with a KV cache.

Layout: weights are ``(out_features, in_features)`` float32 arrays under
Hugging Face's Llama names (``model.layers.N.self_attn.q_proj.weight``,
...); RoPE rotates feature ``i`` with ``i + head_dim/2``; the output
projection is tied to ``model.embed_tokens.weight`` unless
``lm_head.weight`` is present.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np


@dataclass(frozen=True)
class LlamaShape:
    """Hyper-parameters of the forward pass: counts, ``eps`` of RMSNorm, RoPE base."""

    layers: int
    heads: int
    kv_heads: int
    hidden: int
    eps: float
    rope_theta: float

    @property
    def head_dim(self) -> int:
        """Features per attention head."""
        return self.hidden // self.heads


def _rms_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * weight


def _rotate(x: np.ndarray, theta: float, start: int = 0) -> np.ndarray:
    """Half-split RoPE on ``x`` of shape (tokens, heads, head_dim), positions from ``start``."""
    tokens, _, dim = x.shape
    half = dim // 2
    freq = theta ** (-np.arange(half, dtype=np.float32) * 2 / dim)
    angle = np.arange(start, start + tokens, dtype=np.float32)[:, None] * freq[None, :]
    cos, sin = np.cos(angle)[:, None, :], np.sin(angle)[:, None, :]
    first, second = x[..., :half], x[..., half:]
    return np.concatenate([first * cos - second * sin, second * cos + first * sin], axis=-1)


def _forward(
    shape: LlamaShape, w: dict[str, np.ndarray], ids: list[int], cache: list[list[np.ndarray]]
) -> np.ndarray:
    """Logits (vocab,) after ``ids``, which follow the tokens held in ``cache``.

    ``cache``: per layer ``[keys, values]`` of shape (tokens, heads, head_dim),
    extended in place.
    """
    x = w["model.embed_tokens.weight"][np.asarray(ids)]
    tokens, dim = len(ids), shape.head_dim
    past = cache[0][0].shape[0] if cache else 0
    causal = np.triu(np.full((tokens, past + tokens), -np.inf, dtype=np.float32), k=past + 1)
    group = shape.heads // shape.kv_heads
    for layer in range(shape.layers):
        p = f"model.layers.{layer}."
        h = _rms_norm(x, w[p + "input_layernorm.weight"], shape.eps)
        q = (h @ w[p + "self_attn.q_proj.weight"].T).reshape(tokens, -1, dim)
        k = (h @ w[p + "self_attn.k_proj.weight"].T).reshape(tokens, -1, dim)
        v = (h @ w[p + "self_attn.v_proj.weight"].T).reshape(tokens, -1, dim)
        q, k = _rotate(q, shape.rope_theta, past), _rotate(k, shape.rope_theta, past)
        if len(cache) <= layer:
            cache.append([k, v])
        else:
            old_k, old_v = cache[layer]
            cache[layer] = [np.concatenate([old_k, k]), np.concatenate([old_v, v])]
        keys = np.repeat(cache[layer][0], group, axis=1)
        values = np.repeat(cache[layer][1], group, axis=1)
        scores = np.einsum("qhd,khd->hqk", q, keys) / np.sqrt(dim) + causal
        scores = np.exp(scores - scores.max(axis=-1, keepdims=True))
        scores /= scores.sum(axis=-1, keepdims=True)
        attended = np.einsum("hqk,khd->qhd", scores, values).reshape(tokens, -1)
        x = x + attended @ w[p + "self_attn.o_proj.weight"].T
        h = _rms_norm(x, w[p + "post_attention_layernorm.weight"], shape.eps)
        gate = h @ w[p + "mlp.gate_proj.weight"].T
        up = h @ w[p + "mlp.up_proj.weight"].T
        x = x + (gate / (1 + np.exp(-gate)) * up) @ w[p + "mlp.down_proj.weight"].T
    x = _rms_norm(x[-1], w["model.norm.weight"], shape.eps)
    return x @ w.get("lm_head.weight", w["model.embed_tokens.weight"]).T


def logits_last(shape: LlamaShape, w: dict[str, np.ndarray], ids: list[int]) -> np.ndarray:
    """Logits (vocab,) for the token after ``ids``."""
    return _forward(shape, w, ids, [])


def greedy(shape: LlamaShape, w: dict[str, np.ndarray], prompt: list[int], count: int) -> list[int]:
    """``count`` greedy (argmax) token ids after ``prompt`` (with a KV cache)."""
    cache: list[list[np.ndarray]] = []
    logits = _forward(shape, w, list(prompt), cache)
    out: list[int] = []
    for _ in range(count):
        token = int(np.argmax(logits))
        out.append(token)
        if len(out) < count:
            logits = _forward(shape, w, [token], cache)
    return out


def read_tensor_cache(folder: Path) -> dict[str, np.ndarray]:
    """The weights of a WebLLM model folder (``tensor-cache.json`` + its shards) as float32.

    Supports the record formats mlc-llm writes for float32 models: ``raw``
    and ``f32-to-bf16`` (bfloat16 on disk: the upper half of each float32).
    Raises ``ValueError`` for another format or dtype.
    """
    index = json.loads((folder / "tensor-cache.json").read_text())
    weights: dict[str, np.ndarray] = {}
    for shard in index["records"]:
        data = (folder / shard["dataPath"]).read_bytes()
        for record in shard["records"]:
            raw = data[record["byteOffset"] : record["byteOffset"] + record["nbytes"]]
            if record["dtype"] != "float32":
                raise ValueError(f"{record['name']}: dtype {record['dtype']}")
            if record["format"] == "f32-to-bf16":
                upper = np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16
                values = upper.view(np.float32)
            elif record["format"] == "raw":
                values = np.frombuffer(raw, dtype="<f4")
            else:
                raise ValueError(f"{record['name']}: format {record['format']}")
            weights[record["name"]] = values.reshape(record["shape"]).astype(np.float32)
    return weights
