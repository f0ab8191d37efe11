"""NEON and SIMD128 kernels really run on this x86 machine (issue 4).

crates/spinkv-kernels/run-cross-tests.sh builds spinkv-kernels and spinkv-kv for aarch64 and
runs their test suites (every kernel against scalar) under qemu-aarch64, then builds
crates/spinkv-wasm for wasm32+simd128 and runs the same parity checks in node. .ci/run installs
the toolchains and sets SPINKV_REQUIRE_CROSS=1; on a machine without them these tests skip
with a line saying what is missing (or fail, under SPINKV_REQUIRE_CROSS=1).
SPINKV_SKIP_CROSS=1 skips them deliberately (say so when you report results).
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
from conftest import require_cross_toolchain

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "crates" / "spinkv-kernels" / "run-cross-tests.sh"


@pytest.mark.parametrize("isa", ["neon", "wasm"])
def test_cross_isa_kernels_match_scalar(isa: str) -> None:
    require_cross_toolchain(isa)
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
        matched = set(re.findall(r"^neon: (\w+) matches scalar$", output, re.MULTILINE))
        for op in ("matvec", "matmul", "kv_score", "kv_accumulate", "fwht", "rope", "softmax"):
            assert op in matched, output[-4000:]
    else:
        assert "wasm parity: all checks match" in output, output[-4000:]
        assert "ok   simd128 kv_score" in output


def test_kernel_bench_reports_simd128_from_node(
    tiny_model_dir: Path, native: object, capsys: pytest.CaptureFixture[str]
) -> None:
    import json

    require_cross_toolchain("wasm")
    from spinkv.cli.app import run_cli

    args = ["bench", "-m", str(tiny_model_dir), "--kernels", "--isa", "simd128"]
    code = run_cli([*args, "-d", "40", "-n", "8", "-r", "1", "--kv", "turbo", "-f", "json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    record = json.loads(out)
    cross = record["kernel_cases"]
    scans = [r for r in cross if r["isa"] == "simd128" and "key scan turbo" in r["case"]]
    assert scans and scans[0]["gb_s"] > 0 and scans[0]["runtime"].startswith("node")
    assert any(r["isa"] == "scalar" for r in cross)  # the same build's reference
    assert not any("simd128: not measured" in note for note in record["notes"])


def test_cross_bench_lines_parse() -> None:
    from spinkv.bench.cross import parse_bench_lines

    text = """neon matvec f16 49152x576                 12.04 ms     4.7 GB/s
neon key scan turbo K3.5 (8192 tok, 3 qh)   0.33 GB/s   87.80 ns/token
neon encode turbo key (1 token, d 64)     443.9 ns/token
test result: ok. 3 passed"""
    rows = parse_bench_lines(text, "qemu-aarch64 (emulated)", emulated=True)
    assert [r["case"] for r in rows] == [
        "matvec f16 49152x576",
        "key scan turbo K3.5 (8192 tok, 3 qh)",
        "encode turbo key (1 token, d 64)",
    ]
    assert rows[0]["ms"] == 12.04 and rows[0]["gb_s"] == 4.7
    assert rows[1]["ns_per_token"] == 87.8 and rows[2]["ns_per_token"] == 443.9
    assert all(r["emulated"] and "qemu" in r["runtime"] for r in rows)
