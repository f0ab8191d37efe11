"""Prefill and decode speed at several context depths (median of runs), JSON out.

    python benches/decode.py [--model smollm2] [--depths 512,4096] [--gen 64] [--runs 3]
                             [--kv fp16] [--threads 2] [--out results.json]

A thin wrapper over `spinkv bench` (spinkv.bench.cases), kept for its JSON record: for each
depth D, prefill D tokens of real text into a fresh session, then decode --gen tokens
greedily at depth D. `spinkv bench -p 0 -n GEN -d DEPTHS --kv KV --json` gives the same
figures with spread, phases and memory; add --compare-llama-cpp to run llama.cpp beside it.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
from pathlib import Path

from spinkv import _native, api
from spinkv.bench import cases as bm
from spinkv.bench.runner import run_benchmark
from spinkv.eval.arms import parse_arms
from spinkv.util.progress import Steps


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

    loaded = api.load(args.model, threads=args.threads)
    settings = bm.BenchSettings(
        n_prompt=(0,),
        n_gen=(args.gen,),
        depths=bm.parse_int_list(args.depths, "--depths", minimum=1),
        reps=args.runs,
        isas=(_native.isa(),),
        arms=tuple(parse_arms(args.kv)),
    )
    settings.validate()
    record = run_benchmark(loaded, settings, Steps(), command=" ".join(sys.argv))
    rows = []
    for row in record["rows"]:
        result = {
            "kv": row["kv"],
            "depth": row["depth"],
            "gen": args.gen,
            "runs": args.runs,
            "prefill_tok_s": row["fill_tok_s_median"],
            "decode_tok_s": row["decode_tok_s_median"],
            "decode_attention_ms_per_token": row["tg_attention_ms_median"],
            "decode_matmul_ms_per_token": row["tg_matmul_ms_median"],
        }
        rows.append(result)
        print(json.dumps(result), file=sys.stderr, flush=True)
    summary = {
        "model": str(loaded.path),
        "isa": _native.isa(),
        "threads": _native.threads(),
        "machine": platform.machine(),
        "results": rows,
    }
    text = json.dumps(summary, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
