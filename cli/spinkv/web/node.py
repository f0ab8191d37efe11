"""Running the wasm runtime in node (crates/spinkv-wasm/runtime.mjs): the test suite's parity
checks and `spinkv bench --isa simd128` use it."""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from spinkv.web.bundle import BundleError, source_root
from spinkv.web.manifest import model_manifest


def node_binary() -> str:
    """node (v16.4+ runs SIMD128), or BundleError."""
    node = shutil.which("node")
    if node is None:
        raise BundleError("node is not installed (apt-get install nodejs)")
    return node


def run_calls(
    wasm: Path, model_dir: Path, calls: list[dict[str, Any]], timeout: float = 1800.0
) -> list[dict[str, Any]]:
    """Runs `calls` (runtime.mjs's list) in one node process; returns one record per call
    ({"ok": True, "result": ...} or {"ok": False, "error", "kind", "fields"})."""
    script = source_root() / "crates" / "spinkv-wasm" / "runtime.mjs"
    with tempfile.TemporaryDirectory(prefix="spinkv-node-") as tmp:
        manifest = Path(tmp) / "manifest.json"
        manifest.write_text(json.dumps(model_manifest(model_dir)))
        done = subprocess.run(
            [node_binary(), str(script), str(wasm), str(manifest), str(model_dir)],
            input=json.dumps(calls),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    records = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    if len(records) != len(calls) and done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise BundleError(f"the wasm runtime failed in node: {last}")
    return records
