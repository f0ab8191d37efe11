"""How far real rotated K/V rows are from the law turbo's codebooks are fitted to, and what a
codebook fitted to real rows, more bits for some layers, or outlier channels could buy.

    python -m spinkv.eval.kv_study [--tokens 256] > study.json

Runs the model in numpy (float32, the weights of the store's default model; the projections
and RoPE of every attention layer, exactly as tests/reference.py does) over corpus texts,
keeps every layer's post-RoPE keys and values, and for each (layer, KV head) applies what
turbo does before quantizing: divide by the row norm, rotate (random signs + normalised
Walsh–Hadamard, d = head_dim). Then, per coordinate z = y·sqrt(d):

- the codebook turbo uses (Lloyd–Max for the exact sphere-coordinate law, computed here the
  same way as crates/spinkv-kv/src/codebook.rs) and a codebook fitted by Lloyd's algorithm to
  the real z of the *fit* texts, both scored on the *held-out* texts (per-coordinate MSE);
- per layer: the excess kurtosis of z (0 for a Gaussian), the largest channel's share of the
  key energy before rotation (outlier channels), and the attention-logit error
  q·(k − k̂)/sqrt(d) that b-bit codes leave (its RMS over tokens and query heads).

A study, not a suite arm: it says whether a variant can move the front before one is built.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np

from spinkv.eval import corpus

FIT_TEXTS = ("apache-2.0", "bash-intro", "textwrap-py", "zone1970-tab")
TEST_TEXTS = ("mpl-2.0", "gcc-readme-bugs", "json-decoder-py", "services", "bash-posix")
BITS = (2, 3, 4)


def lloyd(samples: np.ndarray, bits: int, init: np.ndarray | None = None) -> np.ndarray:
    """Lloyd's algorithm on 1-D samples (sorted levels)."""
    x = np.sort(samples.astype(np.float64))
    n = 1 << bits
    levels = init if init is not None else np.quantile(x, (np.arange(n) + 0.5) / n)
    for _ in range(200):
        cuts = np.searchsorted(x, 0.5 * (levels[1:] + levels[:-1]))
        parts = np.split(x, cuts)
        new = np.array([p.mean() if len(p) else lv for p, lv in zip(parts, levels)])
        if np.max(np.abs(new - levels)) < 1e-9:
            break
        levels = new
    return levels


def sphere_codebook(d: int, bits: int) -> np.ndarray:
    """Lloyd–Max levels (in z = x·sqrt(d) units) for the exact sphere-coordinate law."""
    r = min(np.sqrt(d), 12.0)
    z = -r + (np.arange(1 << 15) + 0.5) * (2 * r / (1 << 15))
    w = np.exp((d - 3) / 2.0 * np.log1p(-z * z / d))
    w /= w.sum()
    n = 1 << bits
    cdf = np.cumsum(w)
    levels = np.interp((np.arange(n) + 0.5) / n, cdf, z)
    for _ in range(2000):
        cuts = np.searchsorted(z, 0.5 * (levels[1:] + levels[:-1]))
        bounds = np.concatenate([[0], cuts, [len(z)]])
        new = np.array(
            [
                (w[a:b] * z[a:b]).sum() / max(w[a:b].sum(), 1e-300)
                for a, b in zip(bounds[:-1], bounds[1:])
            ]
        )
        if np.max(np.abs(new - levels)) < 1e-10:
            break
        levels = new
    return levels


def quantize(z: np.ndarray, levels: np.ndarray) -> np.ndarray:
    idx = np.searchsorted(0.5 * (levels[1:] + levels[:-1]), z)
    return levels[idx]


def hadamard(d: int) -> np.ndarray:
    h = np.ones((1, 1))
    while h.shape[0] < d:
        h = np.block([[h, h], [h, -h]])
    return h / np.sqrt(d)


def capture(model_dir: str, ids: Sequence[int]) -> tuple[list[np.ndarray], ...]:
    """Per layer: q [T, n_heads, d], k and v [T, n_kv_heads, d] (post-RoPE q and k)."""
    sys.path.insert(0, str(_tests_dir()))
    import reference  # the numpy reference model of tests/

    model = reference.Llama(model_dir, dtype=np.float32)
    c = model.cfg
    T = len(ids)
    x = model.w["model.embed_tokens.weight"][np.asarray(ids)]
    angles = np.outer(np.arange(T), model.freqs)
    cos = np.cos(np.concatenate([angles, angles], -1))[:, None, :].astype(np.float32)
    sin = np.sin(np.concatenate([angles, angles], -1))[:, None, :].astype(np.float32)
    future = np.triu(np.ones((T, T), dtype=bool), k=1)
    group = c.n_heads // c.n_kv_heads
    qs, ks, vs = [], [], []
    for i in range(c.n_layers):
        n = reference.rmsnorm(x, model.layer(i, "input_layernorm"), c.eps)
        q = (n @ model.layer(i, "self_attn.q_proj").T).reshape(T, c.n_heads, c.head_dim)
        k = (n @ model.layer(i, "self_attn.k_proj").T).reshape(T, c.n_kv_heads, c.head_dim)
        v = (n @ model.layer(i, "self_attn.v_proj").T).reshape(T, c.n_kv_heads, c.head_dim)
        q = q * cos + reference.rotate_half(q) * sin
        k = k * cos + reference.rotate_half(k) * sin
        qs.append(q)
        ks.append(k)
        vs.append(v)
        kr, vr = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)
        scores = np.einsum("qhd,khd->hqk", q, kr) / np.sqrt(c.head_dim)
        att = np.einsum(
            "hqk,khd->qhd", reference.softmax(np.where(future[None], -np.inf, scores)), vr
        )
        x = x + att.reshape(T, -1) @ model.layer(i, "self_attn.o_proj").T
        m = reference.rmsnorm(x, model.layer(i, "post_attention_layernorm"), c.eps)
        gate = m @ model.layer(i, "mlp.gate_proj").T
        x = (
            x
            + (reference.silu(gate) * (m @ model.layer(i, "mlp.up_proj").T))
            @ model.layer(i, "mlp.down_proj").T
        )
    return qs, ks, vs


def _tests_dir() -> Any:
    from pathlib import Path

    import spinkv

    return Path(spinkv.__file__).resolve().parents[2] / "tests"


def rotated_unit(rows: np.ndarray, signs: np.ndarray, h: np.ndarray) -> np.ndarray:
    """rows [..., d] → z = (H · diag(signs) · row/‖row‖)·sqrt(d)."""
    d = rows.shape[-1]
    unit = rows / np.maximum(np.linalg.norm(rows, axis=-1, keepdims=True), 1e-30)
    return (unit * signs) @ h.T * np.sqrt(d)


def study(model_dir: str, tokens: int) -> dict[str, Any]:
    import spinkv.api as api

    loaded = api.load(model_dir, threads=1)
    per_text = {}
    for name in (*FIT_TEXTS, *TEST_TEXTS):
        ids = [1, *loaded.tokenize(corpus.load_text(corpus.get(name)))][:tokens]
        per_text[name] = capture(model_dir, ids)
    n_layers = len(per_text[FIT_TEXTS[0]][1])
    n_kv = per_text[FIT_TEXTS[0]][1][0].shape[1]
    d = per_text[FIT_TEXTS[0]][1][0].shape[2]
    rng = np.random.default_rng(20261201)
    h = hadamard(d)
    signs = {
        (kind, i, j): rng.choice([-1.0, 1.0], size=d)
        for kind in "kv"
        for i in range(n_layers)
        for j in range(n_kv)
    }

    def z_of(kind: str, texts: Sequence[str], layer: int) -> np.ndarray:
        out = []
        for t in texts:
            rows = per_text[t][1 if kind == "k" else 2][layer]
            for j in range(n_kv):
                out.append(rotated_unit(rows[:, j, :], signs[(kind, layer, j)], h).ravel())
        return np.concatenate(out)

    result: dict[str, Any] = {"tokens": tokens, "fit_texts": FIT_TEXTS, "test_texts": TEST_TEXTS}
    for kind in "kv":
        fit = np.concatenate([z_of(kind, FIT_TEXTS, i) for i in range(n_layers)])
        test = np.concatenate([z_of(kind, TEST_TEXTS, i) for i in range(n_layers)])
        rows = {}
        for bits in BITS:
            sphere = sphere_codebook(d, bits)
            fitted = lloyd(fit, bits, init=sphere.copy())
            rows[bits] = {
                "mse_sphere_codebook": float(np.mean((test - quantize(test, sphere)) ** 2)),
                "mse_fitted_codebook": float(np.mean((test - quantize(test, fitted)) ** 2)),
                "fitted_levels": [round(float(x), 4) for x in fitted],
                "sphere_levels": [round(float(x), 4) for x in sphere],
            }
        result[kind] = {
            "z_std": float(test.std()),
            "z_excess_kurtosis": float(np.mean(test**4) / np.mean(test**2) ** 2 - 3.0),
            "codebooks": rows,
        }
    layers = []
    for i in range(n_layers):
        zk = z_of("k", TEST_TEXTS, i)
        zv = z_of("v", TEST_TEXTS, i)
        raw_k = np.concatenate([per_text[t][1][i].reshape(-1, d) for t in TEST_TEXTS])
        energy = (raw_k**2).mean(axis=0)
        row: dict[str, Any] = {
            "layer": i,
            "k_excess_kurtosis": float(np.mean(zk**4) / np.mean(zk**2) ** 2 - 3.0),
            "v_excess_kurtosis": float(np.mean(zv**4) / np.mean(zv**2) ** 2 - 3.0),
            "k_top_channel_energy_share": float(energy.max() / energy.sum()),
            "k_top4_channel_energy_share": float(np.sort(energy)[-4:].sum() / energy.sum()),
        }
        for bits in (3, 4):
            levels = sphere_codebook(d, bits)
            err = []
            for t in TEST_TEXTS:
                q, k = per_text[t][0][i], per_text[t][1][i]
                group = q.shape[1] // n_kv
                for j in range(n_kv):
                    s, kk = signs[("k", i, j)], k[:, j, :]
                    norm = np.linalg.norm(kk, axis=-1, keepdims=True)
                    z = rotated_unit(kk, s, h)
                    zq = quantize(z, levels)
                    along = (z * zq).sum(-1, keepdims=True) / d
                    y_hat = zq / np.sqrt(d) / np.maximum(along, 1e-30)  # turbo's unbiased scale
                    k_hat = (y_hat @ h) * s * norm  # back to the key's own basis
                    dk = kk - k_hat
                    for g in range(group):
                        qq = q[:, j * group + g, :]
                        err.append((qq @ dk.T)[np.tril_indices(len(qq))] / np.sqrt(d))
            row[f"logit_error_rms_{bits}bit"] = float(np.sqrt(np.mean(np.concatenate(err) ** 2)))
        layers.append(row)
    result["layers"] = layers
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="model dir (default: the store's default)")
    ap.add_argument("--tokens", type=int, default=256)
    a = ap.parse_args(argv)
    import spinkv.api as api

    model_dir = a.model or api.load(None, threads=1).info["path"]
    sys.stdout.write(json.dumps(study(model_dir, a.tokens)) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
