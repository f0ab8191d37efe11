"""Memory discipline of the browser runtime: a long chat in turbo grows no wasm memory after
warm-up (issue 10's proof: 7,680 tokens).

    python benches/web_memory.py [--model NAME|PATH] [--kv turbo] [--tokens 7680]
                                 [--reply-tokens 48] [--out web_memory.json]

Runs the wasm build (wasm32+simd128, single thread) in node, as the page's worker runs it: the
whole context's cache pages reserved when the session starts, then a chat in the model's
template whose user turns are paragraphs of a real text (/usr/share/common-licenses/GPL-3)
and whose replies are greedy. Turn 1 is the warm-up; after it the runtime's growth counter
is reset (`mark`). Prints one line per turn (tokens, pages, growth events) and a JSON report;
exit status 1 when memory grew after warm-up or during decode. Not part of the test run
(tests/test_wasm_runtime.py keeps a short version).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
TEXT = Path("/usr/share/common-licenses/GPL-3")


def paragraphs(path: Path, min_chars: int = 600) -> list[str]:
    """The text's paragraphs, short ones joined to the next so each user turn is substantial."""
    out: list[str] = []
    current = ""
    for block in path.read_text(encoding="utf-8").split("\n\n"):
        block = " ".join(block.split())
        if not block:
            continue
        current = f"{current} {block}".strip()
        if len(current) >= min_chars:
            out.append(current)
            current = ""
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="store name or directory (default model)")
    parser.add_argument("--kv", default="turbo")
    parser.add_argument("--tokens", type=int, default=7680)
    parser.add_argument("--reply-tokens", type=int, default=48)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)

    from spinkv.models.store import resolve_model
    from spinkv.web.bundle import build_bundle
    from spinkv.web.manifest import model_manifest
    from spinkv.web.node import node_binary

    model_dir = resolve_model(args.model)
    wasm = build_bundle(lambda line: print(line, file=sys.stderr))
    turns: list[dict[str, Any]] = []
    done: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="spinkv-web-memory-") as tmp:
        manifest, plan = Path(tmp) / "manifest.json", Path(tmp) / "plan.json"
        manifest.write_text(json.dumps(model_manifest(model_dir)))
        plan.write_text(
            json.dumps(
                {
                    "kv": args.kv,
                    "target_tokens": args.tokens,
                    "reply_tokens": args.reply_tokens,
                    "paragraphs": paragraphs(TEXT),
                }
            )
        )
        script = ROOT / "benches" / "web_memory.mjs"
        command = [node_binary(), str(script), str(wasm), str(manifest), str(model_dir), str(plan)]
        started = time.perf_counter()
        with subprocess.Popen(command, stdout=subprocess.PIPE, text=True) as process:
            assert process.stdout is not None
            for line in process.stdout:
                record = json.loads(line)
                if "turn" in record:
                    turns.append(record)
                    m = record["memory"]
                    print(
                        f"turn {record['turn']:3d}  {record['tokens']:5d} tokens  "
                        f"+{record['user_tokens']} user +{record['reply_tokens']} reply  "
                        f"{m['pages']} pages (peak {m['peak_pages']})  growth since warm-up "
                        f"{m['growth_since_mark']}, in decode {m['growth_during_decode']}  "
                        f"[{time.perf_counter() - started:.0f} s]",
                        flush=True,
                    )
                elif "done" in record:
                    done = record["done"]
                else:
                    print(json.dumps(record), flush=True)
        if process.returncode != 0 or not done:
            print(f"error: the node run failed (exit status {process.returncode})", file=sys.stderr)
            return 2
    memory = done["memory"]
    report = {
        "model": str(model_dir),
        "kv": args.kv,
        "codec": done["codec"],
        "tokens": done["tokens"],
        "turns": done["turns"],
        "wall_s": done["wall_s"],
        "pages": memory["pages"],
        "peak_pages": memory["peak_pages"],
        "growth_events": memory["growth_events"],
        "growth_after_warmup": memory["growth_since_mark"],
        "growth_during_decode": memory["growth_during_decode"],
        "turn_records": turns,
    }
    if args.out:
        args.out.write_text(json.dumps(report, indent=1))
    summary = {k: v for k, v in report.items() if k != "turn_records"}
    print(json.dumps(summary, indent=1))
    grew = report["growth_after_warmup"] or report["growth_during_decode"]
    return 1 if grew else 0


if __name__ == "__main__":
    sys.exit(main())
