"""Prefill and decode speed at several context depths (median of runs), JSON out.

    python benches/decode.py [--model smollm2] [--depths 512,4096] [--gen 64] [--runs 3]
                             [--kv fp16] [--threads 2] [--out results.json]

For each depth D: prefill D tokens of real text (GPL-3 + MPL-2.0 + Apache-2.0 licence texts,
repeated if needed) into a fresh session, then decode --gen tokens greedily. Decode tok/s is
measured at depth D (the cache holds D..D+gen tokens). Run it beside llama.cpp's anchor script
(../shared/anchors/llamacpp_bench.py) on the same machine to compare.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

from spinkv import _native
from spinkv.store import resolve_model
from spinkv.tokenizer import load_tokenizer

LICENCES = ("GPL-3", "MPL-2.0", "Apache-2.0")


def text_tokens(tokenizer, n: int, bos: int | None) -> list[int]:
    root = Path("/usr/share/common-licenses")
    text = "".join((root / name).read_text() for name in LICENCES)
    ids = tokenizer.encode(text)
    prefix = [bos] if bos is not None else []
    tokens = prefix + ids
    while len(tokens) < n:
        tokens += ids
    return tokens[:n]


def run_once(model: _native.Model, tokens: list[int], gen: int, kv: dict) -> dict[str, float]:
    session = model.session(kv=kv)
    start = time.perf_counter()
    session.prefill(tokens)
    prefill_s = time.perf_counter() - start
    session.reset_timings()
    sampler = _native.Sampler()
    token = session.sample(sampler)
    start = time.perf_counter()
    for _ in range(gen):
        session.decode(token)
        token = session.sample(sampler)
    decode_s = time.perf_counter() - start
    timings = session.timings()
    return {
        "prefill_tok_s": len(tokens) / prefill_s,
        "decode_tok_s": gen / decode_s,
        "decode_attention_ms_per_token": timings["attention_ms"] / gen,
        "decode_matmul_ms_per_token": timings["matmul_ms"] / gen,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None)
    parser.add_argument("--depths", default="512,4096")
    parser.add_argument("--gen", type=int, default=64)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--kv", default="fp16", help="KV preset(s), comma separated")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--out", default=None, help="write the JSON record here too")
    args = parser.parse_args()

    if args.threads:
        _native.set_threads(args.threads)
    model_dir = resolve_model(args.model)
    model = _native.Model.load(str(model_dir))
    tokenizer = load_tokenizer(model_dir)
    depths = [int(d) for d in args.depths.split(",")]
    rows = []
    for preset in args.kv.split(","):
        for depth in depths:
            tokens = text_tokens(tokenizer, depth, model.config.get("bos_token_id"))
            runs = [run_once(model, tokens, args.gen, {"preset": preset}) for _ in range(args.runs)]
            row = {"kv": preset, "depth": depth, "gen": args.gen, "runs": args.runs}
            for key in runs[0]:
                row[key] = statistics.median(r[key] for r in runs)
            rows.append(row)
            print(json.dumps(row), file=sys.stderr, flush=True)
    record = {
        "model": str(model_dir),
        "isa": _native.isa(),
        "threads": _native.threads(),
        "machine": platform.machine(),
        "results": rows,
    }
    text = json.dumps(record, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
