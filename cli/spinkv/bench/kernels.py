"""`spinkv bench --kernels`: KV kernel speed per ISA, measured through a probe model.

There is no native kernel-benchmark entry point yet, so this drives the real attention path
through a one-layer random model with the benchmarked model's attention geometry (heads,
KV heads, head_dim) and a negligible MLP and vocabulary. At depth D each decode step's
attention time (runtime timer: KV append + scores + softmax + value accumulation, one layer)
gives the combined key+value scan rate; the steps that seal a page into the compressed
format, compared with their neighbours, give an estimate of append-time encoding per token.
Key scan and value scan cannot be told apart from Python; NEON and WASM SIMD128 are not
measured here (see the notes in the output).
"""

from __future__ import annotations

import json
import statistics
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from spinkv.bench.cases import FILL_CHUNK, codec_excess_ms, summarize
from spinkv.bench.report import Column, fmt_num, fmt_size
from spinkv.eval.arms import KvArm
from spinkv.util.progress import Steps

PROBE_VOCAB = 256
PROBE_MLP = 32
DEFAULT_DEPTHS = (512, 4096)
NOT_MEASURED = {
    "neon": "neon: not measured (needs the aarch64 kernel benchmark under qemu, marked emulated)",
    "simd128": "simd128: not measured (needs the spinkv-wasm kernel benchmark run in node)",
}
KERNEL_NOTES = (
    "probe model: one layer with the model's attention shape; attend = one decode step's "
    "attention in that layer (KV append + key scan + softmax + value scan, all query heads); "
    "K+V GB/s = packed cache bytes of the layer / attend time; encode (est.) = extra "
    "attention time of steps that sealed a page, per sealed token and layer",
)


def probe_config(model_config: Mapping[str, Any], max_context: int) -> dict[str, Any]:
    heads, head_dim = int(model_config["n_heads"]), int(model_config["head_dim"])
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": heads * head_dim,
        "intermediate_size": PROBE_MLP,
        "num_hidden_layers": 1,
        "num_attention_heads": heads,
        "num_key_value_heads": int(model_config["n_kv_heads"]),
        "head_dim": head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": max_context,
        "rms_norm_eps": 1e-5,
        "rope_theta": float(model_config.get("rope_theta", 10000.0)),
        "vocab_size": PROBE_VOCAB,
        "tie_word_embeddings": True,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "torch_dtype": "float16",
    }


def _probe_weights(config: Mapping[str, Any], seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    hidden, mlp = config["hidden_size"], config["intermediate_size"]
    q_rows = config["num_attention_heads"] * config["head_dim"]
    kv_rows = config["num_key_value_heads"] * config["head_dim"]

    def dense(rows: int, cols: int) -> np.ndarray:
        return rng.standard_normal((rows, cols)).astype(np.float32) / np.sqrt(cols)

    p = "model.layers.0."
    return {
        "model.embed_tokens.weight": dense(config["vocab_size"], hidden) * 8,
        "model.norm.weight": np.ones(hidden, np.float32),
        p + "input_layernorm.weight": np.ones(hidden, np.float32),
        p + "post_attention_layernorm.weight": np.ones(hidden, np.float32),
        p + "self_attn.q_proj.weight": dense(q_rows, hidden),
        p + "self_attn.k_proj.weight": dense(kv_rows, hidden),
        p + "self_attn.v_proj.weight": dense(kv_rows, hidden),
        p + "self_attn.o_proj.weight": dense(hidden, q_rows),
        p + "mlp.gate_proj.weight": dense(mlp, hidden),
        p + "mlp.up_proj.weight": dense(mlp, hidden),
        p + "mlp.down_proj.weight": dense(hidden, mlp),
    }


@contextmanager
def probe_model(model_config: Mapping[str, Any], max_context: int) -> Iterator[Any]:
    """A loaded native probe model, its files in a temporary directory."""
    from spinkv import _native
    from spinkv.util.safetensors_io import save_safetensors

    config = probe_config(model_config, max_context)
    with tempfile.TemporaryDirectory(prefix="spinkv-probe-") as tmp:
        (Path(tmp) / "config.json").write_text(json.dumps(config))
        save_safetensors(Path(tmp) / "model.safetensors", _probe_weights(config), "f16")
        yield _native.Model.load(tmp)


def measure_kernels(
    model: Any, arm: KvArm, depth: int, steps: int, seed: int
) -> dict[str, float | None]:
    """One repetition at one depth: attend µs, K+V GB/s, encode ns per sealed token."""
    from spinkv import _native

    rng = np.random.default_rng(seed)
    session = model.session(kv=dict(arm.kv))
    tokens = rng.integers(3, PROBE_VOCAB, size=max(depth, 1)).tolist()
    for start in range(0, len(tokens), FILL_CHUNK):
        session.prefill(tokens[start : start + FILL_CHUNK])
    sampler = _native.Sampler()
    token = session.sample(sampler)
    attention: list[float] = []
    sealed: list[bool] = []
    sealed_tokens = 0
    prev_ms = session.timings()["attention_ms"]
    prev_sealed = session.cache_stats()["total"]["compressed_tokens"]
    for _ in range(steps):
        session.decode(token)
        token = session.sample(sampler)
        now_ms = session.timings()["attention_ms"]
        now_sealed = session.cache_stats()["total"]["compressed_tokens"]
        attention.append(now_ms - prev_ms)
        sealed.append(now_sealed > prev_sealed)
        sealed_tokens += now_sealed - prev_sealed
        prev_ms, prev_sealed = now_ms, now_sealed
    plain = [a for a, s in zip(attention, sealed) if not s] or attention
    attend_ms = statistics.median(plain)
    total = session.cache_stats()["total"]
    payload = total["k_payload_bytes"] + total["v_payload_bytes"] + total["norm_bytes"]
    encode = None
    if sealed_tokens:
        encode = codec_excess_ms(attention, sealed) * 1e6 / sealed_tokens
    return {
        "attend_us": attend_ms * 1000.0,
        "scan_gb_s": payload / (attend_ms / 1000.0) / 1e9 if attend_ms > 0 else None,
        "encode_ns_per_token": encode,
        "kv_payload_bytes": float(payload),
    }


def run_kernels(
    model_config: Mapping[str, Any],
    isas: Sequence[str],
    arms: Sequence[KvArm],
    depths: Sequence[int],
    steps: int,
    reps: int,
    progress: Steps,
) -> list[dict[str, Any]]:
    from spinkv import _native

    rows = []
    with probe_model(model_config, max(depths) + steps + 64) as model:
        for isa in isas:
            _native.set_isa(isa)
            for arm in arms:
                for depth in depths:
                    samples = []
                    for rep in range(reps):
                        samples.append(measure_kernels(model, arm, depth, steps, seed=rep))
                        progress.advance()
                    rows.append(_kernel_row(isa, arm, depth, steps, samples))
    return rows


def _kernel_row(
    isa: str, arm: KvArm, depth: int, steps: int, samples: Sequence[Mapping[str, Any]]
) -> dict[str, Any]:
    row: dict[str, Any] = {
        "engine": "spinkv probe",
        "isa": isa,
        "kv": arm.label,
        "depth": depth,
        "steps": steps,
        "reps": len(samples),
        "emulated": False,
    }
    for metric in ("attend_us", "scan_gb_s", "encode_ns_per_token"):
        summary = summarize(s[metric] for s in samples)
        mean, std, median = summary if summary else (None, None, None)
        row[metric], row[f"{metric}_std"], row[f"{metric}_median"] = mean, std, median
    row["kv_payload_bytes"] = int(max(s["kv_payload_bytes"] for s in samples))
    return row


def _pm(row: Mapping[str, Any], key: str, digits: int) -> str:
    if row.get(key) is None:
        return "-"
    return f"{fmt_num(row[key], digits)} ± {fmt_num(row[f'{key}_std'] or 0.0, digits)}"


KERNEL_COLUMNS: list[Column] = [
    ("isa", lambda r: str(r["isa"])),
    ("kv", lambda r: str(r["kv"])),
    ("depth", lambda r: str(r["depth"])),
    ("attend µs/layer", lambda r: _pm(r, "attend_us", 1)),
    ("K+V scan GB/s", lambda r: _pm(r, "scan_gb_s", 2)),
    ("encode ns/token/layer (est.)", lambda r: _pm(r, "encode_ns_per_token", 0)),
    ("KV bytes/layer", lambda r: fmt_size(r.get("kv_payload_bytes"))),
]
