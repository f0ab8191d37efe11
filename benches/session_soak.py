"""Soak test: a long chat with a save after every turn and frequent restores; RSS must stay flat.

    python benches/session_soak.py [--model tiny|smollm2|PATH] [--turns 200] [--kv turbo]
                                   [--max-tokens 16] [--max-context 512] [--restore-every 5]
                                   [--clear-every 50] [--out soak.json]

Every turn: one user message (a line of GPL-3), one reply, then the session is saved atomically
(spinkv.sessions.store.save_chat). Every --restore-every turns the chat is dropped and a new one is
restored from the file (its KV cache must be reused). Every --clear-every turns the chat is
cleared. With --max-context the cache slides. RSS (VmRSS) is sampled every 10 turns; the JSON
report gives the samples and the growth between the first sample after warm-up and the last.
Not part of the default test run.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def resolve(model: str, scratch: Path) -> str | None:
    if model != "tiny":
        return None if model == "smollm2" else model
    sys.path.insert(0, str(ROOT / "models"))
    from tiny import make_tiny_model

    return str(make_tiny_model(scratch / "tiny", max_position_embeddings=4096))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--turns", type=int, default=200)
    parser.add_argument("--kv", default="turbo")
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--max-context", type=int, default=512)
    parser.add_argument("--restore-every", type=int, default=5)
    parser.add_argument("--clear-every", type=int, default=50)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)

    scratch = Path(tempfile.mkdtemp(prefix="spinkv-soak-"))
    import spinkv
    from spinkv.sessions.store import restore_chat, save_chat

    model = spinkv.load(resolve(args.model, scratch))
    kv = {"preset": args.kv, "max_context": args.max_context}
    path = scratch / "soak.spkv"
    lines = [
        line.strip()
        for line in Path("/usr/share/common-licenses/GPL-3").read_text().splitlines()
        if len(line.strip()) > 30
    ]

    def new_chat() -> spinkv.ChatSession:
        return model.chat(kv=kv, max_tokens=args.max_tokens)

    chat = new_chat()
    samples: list[dict[str, float]] = []
    save_ms: list[float] = []
    restore_ms: list[float] = []
    refused = 0
    started = time.perf_counter()
    for turn in range(1, args.turns + 1):
        chat.ask(lines[turn % len(lines)])
        t0 = time.perf_counter()
        size = save_chat(chat, path)
        save_ms.append((time.perf_counter() - t0) * 1000)
        if turn % args.restore_every == 0:
            del chat
            chat = new_chat()
            t0 = time.perf_counter()
            outcome = restore_chat(chat, path)
            restore_ms.append((time.perf_counter() - t0) * 1000)
            refused += not outcome.reused
        if args.clear_every and turn % args.clear_every == 0:
            chat.clear()
        if turn % 10 == 0 or turn == 1:
            stats = chat.stats()
            samples.append(
                {
                    "turn": turn,
                    "rss_mb": round(rss_mb(), 1),
                    "cached_tokens": stats["cached_tokens"],
                    "retired_tokens": stats["retired_tokens"],
                    "pool_mb": round(stats["cache"]["pool_bytes"] / 2**20, 2),
                    "file_kb": round(size / 1024, 1),
                }
            )
            print(json.dumps(samples[-1]), file=sys.stderr)
    warm = next((s for s in samples if s["turn"] >= 50), samples[0])
    report = {
        "model": model.name,
        "kv": kv,
        "turns": args.turns,
        "seconds": round(time.perf_counter() - started, 1),
        "restores": len(restore_ms),
        "restores_refused": refused,
        "save_ms_median": round(sorted(save_ms)[len(save_ms) // 2], 2),
        "restore_ms_median": round(sorted(restore_ms)[len(restore_ms) // 2], 2)
        if restore_ms
        else None,
        "rss_mb_first": samples[0]["rss_mb"],
        "rss_mb_after_warmup": warm["rss_mb"],
        "rss_mb_last": samples[-1]["rss_mb"],
        "rss_mb_max": max(s["rss_mb"] for s in samples),
        "rss_growth_after_warmup_mb": round(samples[-1]["rss_mb"] - warm["rss_mb"], 1),
        "samples": samples,
    }
    text = json.dumps(report, indent=2)
    if args.out:
        args.out.write_text(text + "\n")
    print(text)
    return 0 if refused == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
