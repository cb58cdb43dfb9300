"""The TinyChat network: a minimal llama-architecture transformer in PyTorch.

Rules
- RMSNorm, rotary position embeddings, SwiGLU feed-forward, no biases, tied
  input/output embeddings: exactly what llama.cpp's ``llama`` architecture
  computes, so the weights load there unchanged.
- RoPE is the *interleaved* variant (llama.cpp ``LLAMA_ROPE_TYPE_NORM``),
  rotating adjacent pairs ``(x[2i], x[2i+1])``; the weights therefore go into
  GGUF as they are, with no q/k permutation (Hugging Face checkpoints need one
  only because they use the rotate-half layout).
- Needs torch; used only to regenerate the model (train.py, export_gguf.py).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn


@dataclass
class Config:
    """Model shape. Defaults are the published TinyChat (984,192 parameters)."""

    vocab_size: int = 1024
    dim: int = 128
    n_layers: int = 4
    n_heads: int = 4
    n_kv_heads: int = 4
    hidden_dim: int = 384
    max_seq_len: int = 512
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0

    def to_dict(self) -> dict[str, Any]:
        """The config as a plain dict (stored in model.pt)."""
        return asdict(self)


class RMSNorm(nn.Module):
    """Root-mean-square layer norm with a learned scale."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rope_cos_sin(
    head_dim: int, positions: torch.Tensor, theta: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Cosines and sines of the rotary angles, each of shape (T, head_dim / 2)."""
    freqs = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    ang = positions.float()[:, None] * freqs[None, :]
    return ang.cos(), ang.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate adjacent pairs of ``x`` (B, T, H, head_dim) by the rotary angles."""
    b, t, h, d = x.shape
    xp = x.float().reshape(b, t, h, d // 2, 2)
    x0, x1 = xp[..., 0], xp[..., 1]
    c, s = cos[None, :, None, :], sin[None, :, None, :]
    out = torch.stack([x0 * c - x1 * s, x0 * s + x1 * c], dim=-1)
    return out.reshape(b, t, h, d).type_as(x)


class Attention(nn.Module):
    """Causal multi-head self-attention with RoPE (grouped KV heads supported)."""

    def __init__(self, cfg: Config) -> None:
        super().__init__()
        self.n_heads, self.n_kv = cfg.n_heads, cfg.n_kv_heads
        self.hd = cfg.dim // cfg.n_heads
        self.wq = nn.Linear(cfg.dim, cfg.n_heads * self.hd, bias=False)
        self.wk = nn.Linear(cfg.dim, cfg.n_kv_heads * self.hd, bias=False)
        self.wv = nn.Linear(cfg.dim, cfg.n_kv_heads * self.hd, bias=False)
        self.wo = nn.Linear(cfg.n_heads * self.hd, cfg.dim, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q = self.wq(x).view(b, t, self.n_heads, self.hd)
        k = self.wk(x).view(b, t, self.n_kv, self.hd)
        v = self.wv(x).view(b, t, self.n_kv, self.hd)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if self.n_kv != self.n_heads:
            rep = self.n_heads // self.n_kv
            k = k.repeat_interleave(rep, dim=2)
            v = v.repeat_interleave(rep, dim=2)
        q, k, v = (u.transpose(1, 2) for u in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        out: torch.Tensor = self.wo(y.transpose(1, 2).reshape(b, t, -1))
        return out


class FeedForward(nn.Module):
    """SwiGLU: ``w2(silu(w1 x) * w3 x)`` (w1 gate, w3 up, w2 down)."""

    def __init__(self, cfg: Config) -> None:
        super().__init__()
        self.w1 = nn.Linear(cfg.dim, cfg.hidden_dim, bias=False)
        self.w2 = nn.Linear(cfg.hidden_dim, cfg.dim, bias=False)
        self.w3 = nn.Linear(cfg.dim, cfg.hidden_dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.w2(F.silu(self.w1(x)) * self.w3(x))
        return out


class Block(nn.Module):
    """One pre-norm transformer layer: attention then feed-forward, both residual."""

    def __init__(self, cfg: Config) -> None:
        super().__init__()
        self.attention_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.attention = Attention(cfg)
        self.ffn_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.feed_forward = FeedForward(cfg)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.attention_norm(x), cos, sin)
        out: torch.Tensor = x + self.feed_forward(self.ffn_norm(x))
        return out


class Transformer(nn.Module):
    """The whole model: token ids (B, T) -> logits (B, T, vocab_size)."""

    def __init__(self, cfg: Config) -> None:
        super().__init__()
        self.cfg = cfg
        self.tok_embeddings = nn.Embedding(cfg.vocab_size, cfg.dim)
        self.layers = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.output = nn.Linear(cfg.dim, cfg.vocab_size, bias=False)
        self.output.weight = self.tok_embeddings.weight  # tied
        self.apply(self._init)
        for name, p in self.named_parameters():
            if name.endswith(("wo.weight", "w2.weight")):
                nn.init.normal_(p, 0.0, 0.02 / (2 * cfg.n_layers) ** 0.5)

    @staticmethod
    def _init(m: nn.Module) -> None:
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, 0.0, 0.02)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        _, t = idx.shape
        head_dim = self.cfg.dim // self.cfg.n_heads
        cos, sin = rope_cos_sin(head_dim, torch.arange(t), self.cfg.rope_theta)
        x = self.tok_embeddings(idx)
        for layer in self.layers:
            x = layer(x, cos, sin)
        out: torch.Tensor = self.output(self.norm(x))
        return out

    @torch.no_grad()
    def greedy(self, ids: list[int], max_new: int, stop_ids: tuple[int, ...] = ()) -> list[int]:
        """Greedy decoding: up to ``max_new`` new token ids, stopping before a stop id."""
        ids = list(ids)
        out: list[int] = []
        for _ in range(max_new):
            logits = self(torch.tensor([ids[-self.cfg.max_seq_len :]]))[0, -1]
            nxt = int(logits.argmax())
            if nxt in stop_ids:
                break
            ids.append(nxt)
            out.append(nxt)
        return out
