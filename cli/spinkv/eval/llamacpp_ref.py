"""llama.cpp's quantized KV caches on the suite's corpus: reference rows for the Pareto front.

    python -m spinkv.eval.llamacpp_ref MODEL.f16.gguf --kv q8_0,q4_0 --tier full > ref.json

For every corpus text of the tier, the same token ids the suite feeds our runtime (BOS + the
text's first tokens, from our tokenizer; llama.cpp tokenizes these texts identically, see
tests/test_gguf_export.py) are evaluated by llama.cpp once with an f16 KV cache and once per
quantized KV type, all logits kept; KL(p_f16 || p_kv), top-1 agreement and Δppl are computed
per position from `corpus_skip` on, exactly as the suite's corpus part does against our fp16
cache, then per text (paired bootstrap over positions) and pooled over the held-out texts.

The method is the shared anchor's (../shared/anchors/llamacpp_kld.py): one batched evaluation
per text with flash attention, so every token's K/V is quantized before attention reads it
(no fp16 window: a setting no better for llama.cpp than decode). The output is a record
`spinkv eval --suite ... --merge` accepts; its rows appear on the Pareto plot as references.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from spinkv.errors import InvalidInputError
from spinkv.eval import corpus
from spinkv.eval import prereg as prereg_mod
from spinkv.eval import runner as ev
from spinkv.eval import stats as eval_stats
from spinkv.eval.suite import corpus_texts

SCHEMA = "spinkv.eval.llamacpp-reference/1"
BITS = {"q8_0": 8.5, "q4_0": 4.5, "q4_1": 5.0, "q5_0": 5.5, "iq4_nl": 4.5}
"""Bits per channel of llama.cpp's KV block formats (32 values + an f16 scale, q4_1 a min too)."""


def _log_probs(model_path: str, kv: str, ids: list[int], threads: int) -> np.ndarray:
    import llama_cpp
    from llama_cpp import Llama

    ggml_type = getattr(llama_cpp, f"GGML_TYPE_{kv.upper()}")
    llm = Llama(
        model_path,
        n_ctx=len(ids) + 8,
        n_threads=threads,
        n_threads_batch=threads,
        type_k=ggml_type,
        type_v=ggml_type,
        flash_attn=True,
        logits_all=True,
        verbose=False,
        n_batch=512,
    )
    llm.eval(ids)
    logits = np.array(llm._scores[: len(ids)], dtype=np.float64)
    del llm
    return logits


def summarise(
    texts: Sequence[tuple[corpus.CorpusText, list[int], np.ndarray, Mapping[str, np.ndarray]]],
    kinds: Sequence[str],
    skip: int,
    pre: prereg_mod.Preregistration,
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Per text and pooled figures from (text, ids, f16 logits, {kv: logits}) per text, each
    logits array [len(ids), vocab]: positions skip..len-2 (each has a next token)."""
    rows: list[dict[str, Any]] = []
    held: dict[str, list[dict[str, np.ndarray]]] = {kv: [] for kv in kinds}
    for entry, ids, base, by_kind in texts:
        row: dict[str, Any] = {"name": entry.name, "kind": entry.kind, "held_out": entry.held_out}
        row["arms"] = {}
        for kv in kinds:
            series = eval_stats.PositionSeries()
            series.extend(base[:-1], by_kind[kv][:-1], ids[1:])
            arrays = series.arrays(min(skip, len(ids) - 2))
            row["arms"][kv] = eval_stats.paired_bootstrap(
                arrays, resamples=pre.bootstrap_resamples, seed=pre.seed, confidence=pre.confidence
            )
            if entry.held_out:
                held[kv].append(arrays)
        rows.append(row)
    pooled: dict[str, Any] = {}
    for kv in kinds:
        kld = np.concatenate([a["kld"] for a in held[kv]])
        top1 = np.concatenate([a["top1"] for a in held[kv]]).astype(np.float64)
        nll = np.concatenate([a["nll_arm"] - a["nll_ref"] for a in held[kv]])
        pooled[kv] = {
            "kld_mean": float(kld.mean()),
            "top1": float(top1.mean()),
            "ppl_delta_pct": float((np.exp(nll.mean()) - 1.0) * 100.0),
            "units": {"kld_mean": [float(a["kld"].mean()) for a in held[kv]]},
            "bits_beyond_window": BITS[kv],
        }
    return rows, pooled


def reference_rows(
    model_path: str, kinds: list[str], tier_name: str, threads: int, ours: str | None = None
) -> dict[str, Any]:
    """llama.cpp's figures on the tier's corpus; `ours` is the spinkv model whose tokenizer
    makes the token ids (default: the store's default model, the suite's)."""
    import llama_cpp

    import spinkv.api as api

    pre = prereg_mod.load(None)
    tier = pre.tier(tier_name)
    loaded = api.load(ours, threads=1)  # tokenizer only: the suite's exact token ids
    bos = loaded.config.get("bos_token_id")
    started = time.perf_counter()
    texts = []
    for entry in corpus_texts(tier):
        ids = ([int(bos)] if bos is not None else []) + loaded.tokenize(corpus.load_text(entry))
        ids = ids[: tier.corpus_tokens]
        base = _log_probs(model_path, "f16", ids, threads)
        by_kind = {kv: _log_probs(model_path, kv, ids, threads) for kv in kinds}
        texts.append((entry, ids, base, by_kind))
    rows, pooled = summarise(texts, kinds, tier.corpus_skip, pre)
    return {
        "schema": SCHEMA,
        "engine": f"llama.cpp (llama-cpp-python {llama_cpp.__version__})",
        "model_path": model_path,
        "tier": tier_name,
        "tokens": tier.corpus_tokens,
        "skip": tier.corpus_skip,
        "threads": threads,
        "machine": ev.machine_info(),
        "texts": rows,
        "pooled": pooled,
        "seconds": round(time.perf_counter() - started, 1),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", help="an F16 GGUF of the suite's model (spinkv bench exports one)")
    ap.add_argument("--kv", default="q8_0,q4_0", help="llama.cpp KV types, comma separated")
    ap.add_argument("--tier", default="full", help="the preregistered tier whose corpus to use")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--ours", help="spinkv model giving the token ids (default: the store's)")
    a = ap.parse_args(argv)
    kinds = [k.strip() for k in a.kv.split(",") if k.strip()]
    unknown = [k for k in kinds if k not in BITS]
    if unknown or not kinds:
        print(f"error: --kv {a.kv!r}: choose from {', '.join(BITS)}", file=sys.stderr)
        return 2
    if not Path(a.model).is_file():
        print(f"error: {a.model}: no such GGUF file", file=sys.stderr)
        return 2
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        print("error: llama-cpp-python is not installed (pip install llama-cpp-python)",
              file=sys.stderr)  # fmt: skip
        return 2
    try:
        record = reference_rows(a.model, kinds, a.tier, a.threads, a.ours)
    except (InvalidInputError, ValueError) as exc:  # llama.cpp: ValueError when it cannot load
        print(f"error: {exc}", file=sys.stderr)
        return 2
    sys.stdout.write(json.dumps(record) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
