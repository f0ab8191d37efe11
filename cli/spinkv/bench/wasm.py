"""`spinkv bench --isa simd128`: the whole model decoding in the wasm runtime (wasm32+simd128,
the browser build, run in node) beside the native runtime, in one run.

The wasm runtime is driven call by call through `crates/spinkv-wasm/runtime.mjs --serve` by
`WasmEngine`, which the measurement loop of `spinkv.bench.cases` drives exactly as it drives
the native engine: the same text tokens, the same fill to each depth, the same repetitions
and timers (wall time around each decode + greedy-sample pair, measured here). Depth by
depth, the native cases run first and the wasm cases right after, so the two are measured
under the same machine load. The wasm build runs one thread; native runs with -t.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from spinkv.bench import cases as bm
from spinkv.errors import SpinkvError
from spinkv.util.progress import Steps

WASM_ISA = "simd128"
NOTE = (
    "simd128 rows: the browser build (wasm32+simd128, 1 thread) of the same runtime, run in node "
    "{node} beside the native rows depth by depth; peak_rss for them is the wasm memory's size."
)


class WasmEngineError(SpinkvError):
    """The wasm runtime failed or answered with an error."""


class WasmEngine:
    """`bm.Engine` over the wasm runtime in a node process (one call per line)."""

    name = "spinkv"

    def __init__(self, model_dir: Path, progress: Steps | None = None) -> None:
        from spinkv.web.bundle import build_bundle, source_root
        from spinkv.web.manifest import model_manifest
        from spinkv.web.node import node_binary

        def say(line: str) -> None:
            if progress is not None:
                progress.start(f"wasm runtime: {line}", None)

        wasm = build_bundle(say)
        self._tmp = tempfile.TemporaryDirectory(prefix="spinkv-bench-wasm-")
        manifest = Path(self._tmp.name) / "manifest.json"
        manifest.write_text(json.dumps(model_manifest(model_dir)))
        script = source_root() / "crates" / "spinkv-wasm" / "runtime.mjs"
        self.node = node_binary()
        self._process = subprocess.Popen(
            [self.node, str(script), str(wasm), str(manifest), str(model_dir), "--serve"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.loaded = self.call("load")
        self._pages_peak = 0

    def call(self, op: str, **args: Any) -> Any:
        process = self._process
        assert process.stdin is not None and process.stdout is not None
        try:
            process.stdin.write(json.dumps({"op": op, **args}) + "\n")
            process.stdin.flush()
        except BrokenPipeError:
            pass
        line = process.stdout.readline()
        if not line:
            assert process.stderr is not None
            err = process.stderr.read().strip().splitlines()
            raise WasmEngineError(f"the wasm runtime stopped: {err[-1] if err else 'no output'}")
        reply = json.loads(line)
        if not reply["ok"]:
            raise WasmEngineError(f"wasm runtime {op}: {reply['error']}")
        return reply["result"]

    def close(self) -> None:
        if self._process.poll() is None:
            assert self._process.stdin is not None
            self._process.stdin.close()
            try:
                self._process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self._process.kill()
        self._tmp.cleanup()

    # ---- bm.Engine ---------------------------------------------------------------------------

    def new_context(self, kv: Mapping[str, Any] | None) -> None:
        # Pages for the whole context up front, as the page's sessions do.
        self.call("session", kv=dict(kv) if kv else None)

    def prefill(self, tokens: list[int]) -> None:
        for start in range(0, len(tokens), 256):
            self.call("prefill", tokens=tokens[start : start + 256])

    def greedy_next(self) -> int:
        return int(self.call("greedy")["token"])

    def decode(self, token: int) -> None:
        self.call("decode", token=token)

    def mark(self) -> None:
        self.call("checkpoint")

    def restore(self) -> None:
        self.call("rollback")

    def timings(self) -> Mapping[str, float]:
        return self.call("timings")

    def reset_timings(self) -> None:
        self.call("reset_timings")

    def cache_stats(self) -> Mapping[str, Any]:
        return self.call("cache_stats")

    def memory_bytes(self) -> int:
        """The wasm memory's peak size so far."""
        return int(self.call("stats")["memory"]["peak_pages"]) * 65536


def split_wasm(settings: bm.BenchSettings) -> tuple[bm.BenchSettings, bool]:
    """(settings for the native engine, whether simd128 was asked for). Without another ISA the
    native side runs the ISA in use."""
    from dataclasses import replace

    if WASM_ISA not in settings.isas:
        return settings, False
    return replace(settings, isas=tuple(i for i in settings.isas if i != WASM_ISA)), True


def run_with_wasm(
    loaded: Any,
    native: bm.BenchSettings,
    progress: Steps,
    *,
    command: str,
) -> dict[str, Any]:
    """Native cases (settings `native`) and the same cases on simd128 in the wasm runtime,
    depth by depth; the record `spinkv.bench.report.emit` prints, with wasm/native ratios of
    decode speed in its notes."""
    from spinkv import _native
    from spinkv.bench.report import BENCH_NOTES, system_info
    from spinkv.bench.runner import _settings_record, check_context, keep_isa

    all_isas = (*native.isas, WASM_ISA)
    cases = native.cases()
    wasm_cases = [bm.Case(WASM_ISA, c.arm, c.depth, c.n_prompt, c.n_gen) for c in cases]
    check_context(cases, int(loaded.config["max_context"]))
    system = system_info(loaded, isas=all_isas, command=command)
    tokens = bm.text_tokens(
        loaded.tokenizer.encode,
        max(case.max_tokens for case in cases),
        loaded.tokenizer.bos_token_id,
    )
    bos = loaded.tokenizer.bos_token_id
    progress.start("starting the wasm runtime in node", 1)
    wasm = WasmEngine(Path(loaded.path), progress)
    progress.advance()
    native_engine = bm.SpinkvEngine(loaded.native)
    rows: list[dict[str, Any]] = []
    common = (native.reps, tokens, bos, progress)
    progress.start("bench (native, then wasm, depth by depth)", 2 * len(cases) * native.reps)
    try:
        with keep_isa():
            for depth in native.depths:
                ours = [c for c in cases if c.depth == depth]
                rows += bm.run_cases(native_engine, ours, *common, select_isa=_native.set_isa)
                theirs = [c for c in wasm_cases if c.depth == depth]
                for row in bm.run_cases(wasm, theirs, *common):
                    row["peak_rss_bytes"] = wasm.memory_bytes()
                    rows.append(row)
    finally:
        wasm.close()
    settings = bm.BenchSettings(
        n_prompt=native.n_prompt,
        n_gen=native.n_gen,
        depths=native.depths,
        reps=native.reps,
        isas=all_isas,
        arms=native.arms,
    )
    rows.sort(key=settings.row_order)
    system["load_average_end"] = [round(x, 2) for x in os.getloadavg()]
    system["wasm_runtime"] = f"node {wasm_version(wasm)} (wasm32+simd128, 1 thread)"
    return {
        "system": system,
        "settings": _settings_record(settings),
        "rows": rows,
        "ratios": [],
        "notes": [
            BENCH_NOTES,
            NOTE.format(node=wasm_version(wasm)),
            *ratio_notes(rows, _native.threads()),
        ],
    }


def wasm_version(engine: WasmEngine) -> str:
    done = subprocess.run([engine.node, "--version"], capture_output=True, text=True, check=False)
    return done.stdout.strip() or "?"


def ratio_notes(rows: Sequence[Mapping[str, Any]], threads: int) -> list[str]:
    """`simd128 / <native isa>` steady decode speed (medians) per KV preset and depth."""
    native = {
        (r["kv"], r["depth"], r["n_gen"]): r
        for r in rows
        if r["isa"] != WASM_ISA and r.get("tg_tok_s_median")
    }
    notes = []
    for row in rows:
        if row["isa"] != WASM_ISA or not row.get("tg_tok_s_median"):
            continue
        base = native.get((row["kv"], row["depth"], row["n_gen"]))
        if base is None:
            continue
        ratio = row["tg_tok_s_median"] / base["tg_tok_s_median"]
        notes.append(
            f"decode simd128 (wasm, 1 thread) / {base['isa']} ({threads} thread"
            f"{'s' if threads != 1 else ''}), {row['kv']}, depth {row['depth']}: "
            f"{row['tg_tok_s_median']:.2f} / {base['tg_tok_s_median']:.2f} tok/s = {ratio:.2f}x"
        )
    return notes
