"""The kernel benchmark cases shared by every ISA (spinkv-kernels' `bench.rs`: matvec, key and
value scans from fp16 and turbo codes, encoding) for `spinkv bench --kernels`.

ISAs this process runs are measured in it (`_native.kernel_bench`). NEON (an aarch64 build
under qemu, so emulated: not a speed figure) and SIMD128 (a wasm32 build timed in node) are
built and run by crates/spinkv-kernels/run-cross-tests.sh from a source checkout of spinkv:
found as SPINKV_SOURCE, or above the current directory, or above this package's files.
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from spinkv.errors import InvalidInputError

CROSS_ISAS = {"neon": "neon", "simd128": "wasm"}
"""Our ISA name -> the script's --only value."""
RUNTIMES = {"neon": "qemu-aarch64 (emulated)", "simd128": "node (wasm32+simd128)"}
SCRIPT = Path("crates") / "spinkv-kernels" / "run-cross-tests.sh"
TIMEOUT_S = 1800
CASE_NOTES = (
    "kernel cases: spinkv-kernels' benchmark cases (SmolLM2-135M shapes: head dim 64, 3 query "
    "heads per KV head, turbo K3.5/V3), best of 5 trials; native = measured in this process; "
    "neon runs under qemu-aarch64 (emulated: compare it with that build's scalar rows, not with "
    "native figures); simd128 runs in node.",
)

# `simd128 key scan fp16 (8192 tok, 3 qh)       2.80 GB/s   45.72 ns/token`
_LINE = re.compile(
    r"^(?P<isa>scalar|avx2|avx512|neon|simd128) (?P<case>.+?)\s{2,}(?P<figures>\d.*)$"
)
_FIGURE = re.compile(r"(?P<value>\d+(?:\.\d+)?) (?P<unit>GB/s|ns/token|ms)")
_UNIT_KEYS = {"GB/s": "gb_s", "ns/token": "ns_per_token", "ms": "ms"}


def split_cross(isas: Sequence[str]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(ISAs this process runs, NEON/SIMD128 ISAs it cannot run and the cross build must)."""
    from spinkv import _native

    native: list[str] = []
    cross: list[str] = []
    current = _native.isa()
    for name in isas:
        if name in CROSS_ISAS and name != current:
            try:
                _native.set_isa(name)
                native.append(name)
            except _native.SpinkvError:
                cross.append(name)
            finally:
                _native.set_isa(current)
        else:
            native.append(name)
    return tuple(native), tuple(cross)


def source_checkout() -> Path | None:
    """The spinkv source tree holding the cross-test script, if there is one."""
    candidates: list[Path] = []
    if os.environ.get("SPINKV_SOURCE"):
        candidates.append(Path(os.environ["SPINKV_SOURCE"]))
    for start in (Path.cwd(), Path(__file__).resolve().parent):
        candidates += [start, *start.parents]
    for root in candidates:
        if (root / SCRIPT).is_file():
            return root
    return None


def parse_bench_lines(text: str, runtime: str, emulated: bool = False) -> list[dict[str, Any]]:
    """One row per case line of the kernel benchmark's output (a cross build also prints its
    own scalar reference: those rows are kept, with the same runtime)."""
    rows = []
    for line in text.splitlines():
        match = _LINE.match(line.strip())
        if not match:
            continue
        row: dict[str, Any] = {
            "isa": match["isa"],
            "case": match["case"].strip(),
            "runtime": runtime,
            "emulated": emulated,
        }
        for figure in _FIGURE.finditer(match["figures"]):
            row[_UNIT_KEYS[figure["unit"]]] = float(figure["value"])
        rows.append(row)
    return rows


def run_cross_kernels(isas: Sequence[str]) -> list[dict[str, Any]]:
    """Build and run the kernel benchmark for each of isas (neon, simd128); rows per case."""
    root = source_checkout()
    if root is None:
        raise InvalidInputError(
            f"--isa {','.join(isas)} --kernels needs a spinkv source checkout (its {SCRIPT}); "
            "run from one or set SPINKV_SOURCE"
        )
    rows: list[dict[str, Any]] = []
    for isa in isas:
        done = subprocess.run(
            ["bash", str(root / SCRIPT), "--bench", "--only", CROSS_ISAS[isa]],
            cwd=root,
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
        )
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or ["no output"])[-1]
            raise InvalidInputError(f"{isa} kernel benchmark failed: {last}")
        rows += parse_bench_lines(done.stdout + done.stderr, RUNTIMES[isa], isa == "neon")
    return rows


def native_kernel_cases(isas: Sequence[str]) -> list[dict[str, Any]]:
    """The same cases measured in this process, for each of isas (runnable here)."""
    from spinkv import _native

    rows: list[dict[str, Any]] = []
    for isa in isas:
        rows += parse_bench_lines("\n".join(_native.kernel_bench(isa)), "native")
    return rows
