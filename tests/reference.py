"""A numpy reference of the Llama forward pass, written from the architecture for clarity.

Two independent paths compute the same logits:
- `Llama.forward(tokens)`: the whole sequence at once, matrices and a causal mask (HF-style
  RoPE with `rotate_half`);
- `Llama.step(token, cache)`: one token at a time with a KV cache, llama2.c-style loops over
  heads (RoPE as explicit pairs (i, i + head_dim/2)).

The architecture, per layer l and token x (a row of the hidden state):

    h = x + o_proj(attention(rope(q_proj(n)), rope(k_proj(n)), v_proj(n))),  n = rmsnorm(x)
    x = h + down_proj(silu(gate_proj(m)) * up_proj(m)),                   m = rmsnorm(h)

then logits = lm_head(rmsnorm(x)), lm_head tied to embed_tokens when the config says so.
Grouped-query attention: query head j reads kv head j // (n_heads / n_kv_heads).
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from safetensors.numpy import load_file

# ---------------------------------------------------------------------------------------------
# Loading


@dataclass(frozen=True)
class Config:
    n_layers: int
    hidden: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    eps: float
    rope_theta: float
    rope_linear_factor: float  # positions are divided by this (1.0 = no scaling)
    tied: bool


def load_config(model_dir: Path) -> Config:
    c: dict[str, Any] = json.loads((Path(model_dir) / "config.json").read_text())
    scaling = c.get("rope_scaling") or {}
    kind = scaling.get("rope_type", scaling.get("type", "linear"))
    if scaling and kind != "linear":
        raise ValueError(f"reference supports no or linear RoPE scaling, not {kind!r}")
    return Config(
        n_layers=c["num_hidden_layers"],
        hidden=c["hidden_size"],
        n_heads=c["num_attention_heads"],
        n_kv_heads=c.get("num_key_value_heads", c["num_attention_heads"]),
        head_dim=c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"],
        intermediate=c["intermediate_size"],
        vocab=c["vocab_size"],
        eps=c.get("rms_norm_eps", 1e-6),
        rope_theta=c.get("rope_theta", 10000.0),
        rope_linear_factor=float(scaling.get("factor", 1.0)) if scaling else 1.0,
        tied=c.get("tie_word_embeddings", False),
    )


def _load_bf16_file(path: Path) -> dict[str, np.ndarray]:
    """numpy has no bfloat16: read the raw file; a bf16 value is the top half of a float32."""
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    header.pop("__metadata__", None)
    dtypes = {"F32": "<f4", "F16": "<f2", "BF16": "<u2"}
    out = {}
    for name, t in header.items():
        start, end = t["data_offsets"]
        a = np.frombuffer(raw[8 + n + start : 8 + n + end], dtype=dtypes[t["dtype"]])
        if t["dtype"] == "BF16":
            a = (a.astype(np.uint32) << 16).view(np.float32)
        out[name] = a.reshape(t["shape"])
    return out


def load_weights(model_dir: Path) -> dict[str, np.ndarray]:
    """All tensors of model.safetensors (or of every shard in the index)."""
    model_dir = Path(model_dir)
    index = model_dir / "model.safetensors.index.json"
    if index.exists():
        files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    else:
        files = ["model.safetensors"]
    weights: dict[str, np.ndarray] = {}
    for name in files:
        try:
            weights.update(load_file(model_dir / name))
        except TypeError:  # bfloat16
            weights.update(_load_bf16_file(model_dir / name))
    return weights


# ---------------------------------------------------------------------------------------------
# Building blocks


def rmsnorm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    """x / sqrt(mean(x^2) + eps) * weight, over the last axis."""
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * weight


def silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


def softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - np.max(x, axis=-1, keepdims=True))
    return e / np.sum(e, axis=-1, keepdims=True)


def rope_frequencies(cfg: Config) -> np.ndarray:
    """Angle per position unit of each rotated pair i (head_dim/2 of them)."""
    i = np.arange(0, cfg.head_dim, 2, dtype=np.float64)
    return 1.0 / (cfg.rope_theta ** (i / cfg.head_dim)) / cfg.rope_linear_factor


def rotate_half(x: np.ndarray) -> np.ndarray:
    """HF layout: the first half of the head dims pairs with the second half."""
    half = x.shape[-1] // 2
    return np.concatenate([-x[..., half:], x[..., :half]], axis=-1)


# ---------------------------------------------------------------------------------------------
# The model


@dataclass
class KVCache:
    """Keys (post-RoPE) and values per layer: lists of [n_kv_heads, head_dim] rows."""

    keys: list[list[np.ndarray]]
    values: list[list[np.ndarray]]
    tokens: list[int] = field(default_factory=list)


class Llama:
    """kv_dtype=np.float16 rounds keys (after RoPE) and values to float16 as a runtime with an
    fp16 KV cache stores them; None keeps them exact."""

    def __init__(self, model_dir: Path, dtype: Any = np.float64, kv_dtype: Any = None) -> None:
        self.cfg = load_config(model_dir)
        self.dtype = np.dtype(dtype)
        self.kv_dtype = None if kv_dtype is None else np.dtype(kv_dtype)
        self.w = {k: v.astype(self.dtype) for k, v in load_weights(model_dir).items()}
        if self.cfg.tied or "lm_head.weight" not in self.w:
            self.w["lm_head.weight"] = self.w["model.embed_tokens.weight"]
        self.freqs = rope_frequencies(self.cfg)

    def layer(self, i: int, name: str) -> np.ndarray:
        return self.w[f"model.layers.{i}.{name}.weight"]

    def kv_round(self, x: np.ndarray) -> np.ndarray:
        """x as the KV cache stores it."""
        return x if self.kv_dtype is None else x.astype(self.kv_dtype).astype(self.dtype)

    # --- whole sequence at once ------------------------------------------------------------

    def forward(self, tokens: list[int]) -> np.ndarray:
        """Logits [T, vocab] for every position of tokens (a fresh sequence from position 0)."""
        c = self.cfg
        T = len(tokens)
        x = self.w["model.embed_tokens.weight"][np.asarray(tokens)]  # [T, hidden]

        angles = np.outer(np.arange(T), self.freqs)  # [T, head_dim/2]
        cos = np.cos(np.concatenate([angles, angles], axis=-1))[:, None, :].astype(self.dtype)
        sin = np.sin(np.concatenate([angles, angles], axis=-1))[:, None, :].astype(self.dtype)
        future = np.triu(np.ones((T, T), dtype=bool), k=1)  # True where key is after query
        group = c.n_heads // c.n_kv_heads

        for i in range(c.n_layers):
            n = rmsnorm(x, self.layer(i, "input_layernorm"), c.eps)
            q = (n @ self.layer(i, "self_attn.q_proj").T).reshape(T, c.n_heads, c.head_dim)
            k = (n @ self.layer(i, "self_attn.k_proj").T).reshape(T, c.n_kv_heads, c.head_dim)
            v = (n @ self.layer(i, "self_attn.v_proj").T).reshape(T, c.n_kv_heads, c.head_dim)
            q = q * cos + rotate_half(q) * sin
            k = self.kv_round(k * cos + rotate_half(k) * sin)
            v = self.kv_round(v)
            k = np.repeat(k, group, axis=1)  # [T, n_heads, head_dim]: GQA
            v = np.repeat(v, group, axis=1)
            scores = np.einsum("qhd,khd->hqk", q, k) / np.sqrt(c.head_dim)
            scores = np.where(future[None], -np.inf, scores)
            att = np.einsum("hqk,khd->qhd", softmax(scores), v).reshape(T, -1)
            x = x + att @ self.layer(i, "self_attn.o_proj").T

            m = rmsnorm(x, self.layer(i, "post_attention_layernorm"), c.eps)
            gate = m @ self.layer(i, "mlp.gate_proj").T
            up = m @ self.layer(i, "mlp.up_proj").T
            x = x + (silu(gate) * up) @ self.layer(i, "mlp.down_proj").T

        x = rmsnorm(x, self.w["model.norm.weight"], c.eps)
        return x @ self.w["lm_head.weight"].T

    # --- one token at a time (llama2.c style) ----------------------------------------------

    def new_cache(self) -> KVCache:
        n = self.cfg.n_layers
        return KVCache(keys=[[] for _ in range(n)], values=[[] for _ in range(n)])

    def rope_one(self, vec: np.ndarray, pos: int) -> np.ndarray:
        """Rotate each pair (vec[..., i], vec[..., i + half]) by angle pos * freq[i]."""
        half = self.cfg.head_dim // 2
        cos = np.cos(pos * self.freqs).astype(self.dtype)
        sin = np.sin(pos * self.freqs).astype(self.dtype)
        a, b = vec[..., :half], vec[..., half:]
        return np.concatenate([a * cos - b * sin, a * sin + b * cos], axis=-1)

    def step(self, token: int, cache: KVCache) -> np.ndarray:
        """Logits [vocab] after appending token at position len(cache.tokens)."""
        c = self.cfg
        pos = len(cache.tokens)
        cache.tokens.append(token)
        x = self.w["model.embed_tokens.weight"][token].copy()
        group = c.n_heads // c.n_kv_heads

        for i in range(c.n_layers):
            n = rmsnorm(x, self.layer(i, "input_layernorm"), c.eps)
            q = (self.layer(i, "self_attn.q_proj") @ n).reshape(c.n_heads, c.head_dim)
            k = (self.layer(i, "self_attn.k_proj") @ n).reshape(c.n_kv_heads, c.head_dim)
            v = (self.layer(i, "self_attn.v_proj") @ n).reshape(c.n_kv_heads, c.head_dim)
            cache.keys[i].append(self.kv_round(self.rope_one(k, pos)))
            cache.values[i].append(self.kv_round(v))
            keys = np.stack(cache.keys[i])  # [pos+1, n_kv_heads, head_dim]
            values = np.stack(cache.values[i])

            att = np.zeros((c.n_heads, c.head_dim), dtype=self.dtype)
            for h in range(c.n_heads):
                kv = h // group
                qh = self.rope_one(q[h], pos)
                scores = keys[:, kv, :] @ qh / np.sqrt(c.head_dim)  # [pos+1]
                att[h] = softmax(scores) @ values[:, kv, :]
            x = x + self.layer(i, "self_attn.o_proj") @ att.reshape(-1)

            m = rmsnorm(x, self.layer(i, "post_attention_layernorm"), c.eps)
            hidden = silu(self.layer(i, "mlp.gate_proj") @ m) * (self.layer(i, "mlp.up_proj") @ m)
            x = x + self.layer(i, "mlp.down_proj") @ hidden

        x = rmsnorm(x, self.w["model.norm.weight"], c.eps)
        return self.w["lm_head.weight"] @ x

    def greedy(self, prompt: list[int], max_new: int, stop: tuple[int, ...] = ()) -> list[int]:
        """Greedy continuation of prompt: up to max_new tokens, ending early at a stop id."""
        cache = self.new_cache()
        logits = None
        for t in prompt:
            logits = self.step(t, cache)
        out: list[int] = []
        while logits is not None and len(out) < max_new:
            nxt = int(np.argmax(logits))
            out.append(nxt)
            if nxt in stop:
                break
            logits = self.step(nxt, cache)
        return out
