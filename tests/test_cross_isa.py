"""NEON and SIMD128 kernels really run on this x86 machine (issue 4).

crates/spinkv-kernels/run-cross-tests.sh builds spinkv-kernels and spinkv-kv for aarch64 and
runs their test suites (every kernel against scalar) under qemu-aarch64, then builds
crates/spinkv-wasm for wasm32+simd128 and runs the same parity checks in node. .ci/run installs
the toolchains; on a machine without them this test fails and says what is missing.
SPINKV_SKIP_CROSS=1 skips it deliberately (say so when you report results).
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "crates" / "spinkv-kernels" / "run-cross-tests.sh"


@pytest.mark.skipif(os.environ.get("SPINKV_SKIP_CROSS") == "1", reason="SPINKV_SKIP_CROSS=1")
@pytest.mark.parametrize("isa", ["neon", "wasm"])
def test_cross_isa_kernels_match_scalar(isa: str) -> None:
    done = subprocess.run(
        ["bash", str(SCRIPT), "--only", isa],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-4000:]
    assert "cross-ISA checks passed" in output
    if isa == "neon":
        assert re.search(r"neon: \d+ operations match scalar", output), output[-4000:]
    else:
        assert "wasm parity: all checks match" in output, output[-4000:]
        assert "ok   simd128 kv_score" in output
