#!/usr/bin/env bash
# Runs the kernels on the ISAs this x86 machine cannot execute natively:
#   * NEON: spinkv-kernels and spinkv-kv built for aarch64 (Debian's rustc-web + the cross
#     gcc) and their test suites run under qemu-aarch64 user mode;
#   * SIMD128: crates/spinkv-wasm built for wasm32-unknown-unknown with +simd128 (std rebuilt
#     with -Zbuild-std from Debian's rust-web-src) and its parity checks run in node.
# AVX2/AVX-512 parity runs in the ordinary `cargo test` (AVX-512 prints "skipped: ..."
# where the CPU lacks it).
#
# Usage: crates/spinkv-kernels/run-cross-tests.sh [--bench] [--check] [--only neon|wasm]
#   --bench  also run the kernel benchmark in each (NEON figures are under emulation).
#   --check  only check that the toolchains are here (exit 1 with a "missing: ..." line).
#
# Needs (Debian 12): dpkg --add-architecture arm64; apt-get install rustc-web cargo-web
#   libstd-rust-web-dev:arm64 rust-web-src gcc-aarch64-linux-gnu libc6-dev-arm64-cross
#   qemu-user nodejs — plus rustup's stable toolchain for rust-lld (the wasm linker).
# Builds go to target/cross so they never invalidate the rustup builds in target/.
set -euo pipefail
cd "$(dirname "$0")/../.."

bench=0
check=0
only=all
while [ $# -gt 0 ]; do
    case "$1" in
        --bench) bench=1 ;;
        --check) check=1 ;;
        --only) only="$2"; shift ;;
        *) echo "usage: $0 [--bench] [--check] [--only neon|wasm]" >&2; exit 2 ;;
    esac
    shift
done

log() { printf '\n==> %s\n' "$*" >&2; }
need() { command -v "$1" >/dev/null 2>&1 || { echo "missing: $1 ($2)" >&2; exit 1; }; }

# Debian's toolchain (rustup cannot add targets on this machine class).
DEB_RUSTC=/usr/bin/rustc
DEB_CARGO=/usr/bin/cargo
[ -x "$DEB_RUSTC" ] && [ -x "$DEB_CARGO" ] || { echo "missing: Debian rustc-web / cargo-web at /usr/bin" >&2; exit 1; }
export CARGO_TARGET_DIR="$PWD/target/cross"
export RUSTC="$DEB_RUSTC" RUSTDOC=/usr/bin/rustdoc

if [ "$only" = all ] || [ "$only" = neon ]; then
    need aarch64-linux-gnu-gcc "apt-get install gcc-aarch64-linux-gnu libc6-dev-arm64-cross"
    need qemu-aarch64 "apt-get install qemu-user"
    sysroot=/usr/aarch64-linux-gnu
    [ -d /usr/lib/rustlib/aarch64-unknown-linux-gnu ] \
        || { echo "missing: aarch64 std for Debian's rustc (apt-get install libstd-rust-web-dev:arm64)" >&2; exit 1; }
fi
if { [ "$only" = all ] || [ "$only" = neon ]; } && [ "$check" = 0 ]; then
    export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc
    # Code compiled only for aarch64 gets no clippy run here: at least deny its warnings.
    export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUSTFLAGS="-D warnings"
    # The binaries are linked against the cross libc in $sysroot, and qemu takes its dynamic
    # loader from there (-L). But that loader then finds libc.so.6 through the host's
    # /etc/ld.so.cache, which lists /lib/aarch64-linux-gnu (libc6:arm64, pulled in by
    # libstd-rust-web-dev:arm64) — a different glibc build than the loader's. The mismatch
    # corrupts the loader's thread-stack list and every binary that starts a thread (libtest
    # does, even with --test-threads=1) spins forever in pthread_create. Pinning the library
    # path to the same sysroot keeps loader and libc from one build.
    export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER="qemu-aarch64 -L $sysroot -E LD_LIBRARY_PATH=$sysroot/lib"
    log "NEON: spinkv-kernels and spinkv-kv tests, aarch64 under qemu ($(qemu-aarch64 --version | head -1))"
    # Only the tests' stderr (whole `neon: … matches scalar` lines): libtest's stdout, sharing
    # one pipe, used to land in the middle of them under load and hide an op from the check.
    "$DEB_CARGO" test --release --target aarch64-unknown-linux-gnu -p spinkv-kernels -p spinkv-kv \
        -- --nocapture 2>&1 >/dev/null | grep -E '^(neon:|skipped:|error)' || true
    # grep swallows cargo's status: run once more quietly to fail the script on a failure
    # (everything is built and cached by now), and show which test failed and why.
    quiet_log=$(mktemp)
    if ! "$DEB_CARGO" test --release --target aarch64-unknown-linux-gnu -p spinkv-kernels -p spinkv-kv \
        -q >"$quiet_log" 2>&1; then
        grep -v -E '^(neon:|skipped:)' "$quiet_log" | tail -n 60 >&2
        rm -f "$quiet_log"
        exit 1
    fi
    rm -f "$quiet_log"
    if [ "$bench" = 1 ]; then
        log "NEON kernel benchmark (emulated by qemu: not a speed figure)"
        "$DEB_CARGO" run --release --target aarch64-unknown-linux-gnu -p spinkv-kernels \
            --example kernel_bench -- scalar,neon
    fi
fi

if [ "$only" = all ] || [ "$only" = wasm ]; then
    need node "apt-get install nodejs (v16.4+ runs SIMD128)"
    # Debian's /usr/bin/rust-lld is a dangling symlink; rustup's stable toolchain ships one.
    lld=""
    if command -v rustup >/dev/null 2>&1; then
        host_sysroot=$(env -u RUSTC rustup run stable rustc --print sysroot 2>/dev/null || true)
        candidate="$host_sysroot/lib/rustlib/x86_64-unknown-linux-gnu/bin/rust-lld"
        [ -x "$candidate" ] && lld="$candidate"
    fi
    if [ -z "$lld" ]; then
        for candidate in "$HOME"/.rustup/toolchains/*/lib/rustlib/x86_64-unknown-linux-gnu/bin/rust-lld \
            /usr/lib/llvm-*/bin/wasm-ld "$(command -v wasm-ld || true)"; do
            if [ -n "$candidate" ] && [ -x "$candidate" ]; then lld="$candidate"; break; fi
        done
    fi
    [ -n "$lld" ] || { echo "missing: a wasm linker (rustup's rust-lld or lld's wasm-ld)" >&2; exit 1; }
    [ -d /usr/lib/rustlib/src/rust/library ] \
        || { echo "missing: Rust std sources for -Zbuild-std (apt-get install rust-web-src)" >&2; exit 1; }
    [ "$check" = 1 ] && exit 0
    export CARGO_TARGET_WASM32_UNKNOWN_UNKNOWN_LINKER="$lld"
    export CARGO_TARGET_WASM32_UNKNOWN_UNKNOWN_RUSTFLAGS="-C target-feature=+simd128 -D warnings"
    # wasm32 has no unwinding; -Zbuild-std needs the bootstrap switch on a stable rustc.
    export CARGO_PROFILE_RELEASE_PANIC=abort RUSTC_BOOTSTRAP=1
    log "SIMD128: spinkv-wasm for wasm32-unknown-unknown (+simd128, build-std), parity in node $(node --version)"
    "$DEB_CARGO" build -q -Zbuild-std=std,panic_abort --release --target wasm32-unknown-unknown -p spinkv-wasm
    module="$CARGO_TARGET_DIR/wasm32-unknown-unknown/release/spinkv_wasm.wasm"
    steps=(parity)
    [ "$bench" = 1 ] && steps+=(bench)
    node crates/spinkv-wasm/run.mjs "$module" "${steps[@]}"
fi
[ "$check" = 1 ] && exit 0
log "cross-ISA checks passed"
