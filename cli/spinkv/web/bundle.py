"""Building the wasm bundle (crates/spinkv-wasm with the `runtime` feature, wasm32+simd128).

Two toolchains, tried in order:

1. rustup's stable toolchain with the wasm32-unknown-unknown target (added with
   `rustup target add` when missing: a download, shown as progress);
2. Debian's rustc-web + cargo-web + rust-web-src, rebuilding std with `-Zbuild-std` (what
   crates/spinkv-kernels/run-cross-tests.sh uses), linked with rustup's rust-lld or wasm-ld.

The build goes to target/wasm (never invalidating the native builds in target/); cargo
itself decides what is stale. The bundle is built from the source tree this package came
from (an editable install or a checkout), or from $SPINKV_SOURCE.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from spinkv.errors import SpinkvError

TARGET = "wasm32-unknown-unknown"
WASM_NAME = "spinkv_wasm.wasm"
RUSTFLAGS = '-C target-feature=+simd128 --cfg getrandom_backend="custom"'
STATIC = Path(__file__).resolve().parent / "static"


class BundleError(SpinkvError):
    """The wasm bundle cannot be built here (what is missing is in the message)."""


@dataclass
class Toolchain:
    name: str
    cargo: list[str]
    env: dict[str, str] = field(default_factory=dict)
    build_std: bool = False


def source_root() -> Path:
    """The spinkv source tree holding crates/spinkv-wasm."""
    candidates = []
    if os.environ.get("SPINKV_SOURCE"):
        candidates.append(Path(os.environ["SPINKV_SOURCE"]).expanduser())
    candidates.append(Path(__file__).resolve().parents[3])
    for root in candidates:
        if (root / "crates" / "spinkv-wasm" / "Cargo.toml").is_file():
            return root
    raise BundleError(
        "the wasm bundle is built from spinkv's source tree, and this install has none: "
        "install from a checkout (pip install -e .) or set SPINKV_SOURCE to one"
    )


def _run_quiet(args: list[str], env: dict[str, str] | None = None) -> str | None:
    try:
        done = subprocess.run(
            args, capture_output=True, text=True, timeout=120, env=env, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None


def _rust_lld() -> str | None:
    sysroot = _run_quiet(["rustup", "run", "stable", "rustc", "--print", "sysroot"])
    candidates = []
    if sysroot:
        candidates.append(
            Path(sysroot.strip()) / "lib/rustlib/x86_64-unknown-linux-gnu/bin/rust-lld"
        )
    candidates += sorted(Path.home().glob(".rustup/toolchains/*/lib/rustlib/*/bin/rust-lld"))
    candidates += sorted(Path("/usr/lib").glob("llvm-*/bin/wasm-ld"))
    found = shutil.which("wasm-ld")
    if found:
        candidates.append(Path(found))
    return next((str(c) for c in candidates if c.is_file() and os.access(c, os.X_OK)), None)


def find_toolchain(
    progress: Callable[[str], None] = lambda line: None, install: bool = True
) -> Toolchain:
    """A toolchain that builds wasm32+simd128, adding rustup's target when `install`; raises
    BundleError naming what is missing."""
    missing = []
    if shutil.which("rustup") and shutil.which("cargo"):
        installed = _run_quiet(["rustup", "target", "list", "--installed"]) or ""
        if TARGET not in installed.split() and install:
            progress(f"adding the {TARGET} target to rustup's toolchain (a download)")
            try:
                subprocess.run(["rustup", "target", "add", TARGET], check=False, timeout=600)
            except subprocess.TimeoutExpired:
                progress("rustup target add timed out")
            installed = _run_quiet(["rustup", "target", "list", "--installed"]) or ""
        if TARGET in installed.split():
            return Toolchain("rustup stable", ["cargo"])
        missing.append(f"rustup's {TARGET} target (rustup target add {TARGET})")
    else:
        missing.append("rustup + cargo")
    deb_cargo, deb_rustc = Path("/usr/bin/cargo"), Path("/usr/bin/rustc")
    std_src = Path("/usr/lib/rustlib/src/rust/library")
    lld = _rust_lld()
    if deb_cargo.is_file() and deb_rustc.is_file() and std_src.is_dir() and lld:
        env = {
            "RUSTC": str(deb_rustc),
            "RUSTC_BOOTSTRAP": "1",
            "CARGO_TARGET_WASM32_UNKNOWN_UNKNOWN_LINKER": lld,
        }
        return Toolchain("Debian rustc-web (build-std)", [str(deb_cargo)], env, build_std=True)
    missing.append("or Debian rustc-web, cargo-web, rust-web-src and a wasm linker")
    raise BundleError("cannot build the wasm bundle: missing " + " ".join(missing))


def bundle_path(root: Path | None = None) -> Path:
    return (root or source_root()) / "target" / "wasm" / TARGET / "release" / WASM_NAME


def build_bundle(progress: Callable[[str], None] = lambda line: None) -> Path:
    """Builds (or brings up to date) the wasm runtime; returns the .wasm file. Cargo's
    progress lines go to `progress`; a failed build raises BundleError with its last error."""
    root = source_root()
    toolchain = find_toolchain(progress)
    env = dict(os.environ)
    env.update(toolchain.env)
    env.update(
        {
            "CARGO_TARGET_DIR": str(root / "target" / "wasm"),
            "CARGO_TARGET_WASM32_UNKNOWN_UNKNOWN_RUSTFLAGS": RUSTFLAGS,
            "CARGO_PROFILE_RELEASE_PANIC": "abort",
            "CARGO_TERM_COLOR": "never",
            "CARGO_TERM_PROGRESS_WHEN": "never",
        }
    )
    args = [*toolchain.cargo, "build", "--release", "--target", TARGET]
    args += ["-p", "spinkv-wasm", "--features", "runtime"]
    if toolchain.build_std:
        args.insert(len(toolchain.cargo) + 1, "-Zbuild-std=std,panic_abort")
    progress(
        f"building the wasm runtime with {toolchain.name} (a few minutes the first time, "
        "seconds when it is up to date)"
    )
    process = subprocess.Popen(
        args,
        cwd=root,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        errors="replace",
    )
    assert process.stdout is not None
    tail: list[str] = []
    for line in process.stdout:
        line = line.rstrip()
        if not line:
            continue
        tail = [*tail[-40:], line]
        if line.lstrip().startswith(("Compiling", "Finished", "Downloaded", "error")):
            progress(line.strip())
    if process.wait() != 0:
        errors = [t for t in tail if t.lstrip().startswith("error")]
        last = errors[0] if errors else (tail[-1] if tail else "no output")
        raise BundleError(f"building the wasm runtime failed: {last}")
    wasm = bundle_path(root)
    if not wasm.is_file():
        raise BundleError(f"the wasm build finished but {wasm} is missing")
    return wasm
