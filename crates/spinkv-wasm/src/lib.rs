//! spinkv's kernels in a wasm32 module: the parity suite (every SIMD128 kernel against its
//! scalar reference) and a kernel benchmark, exported to a JavaScript host (`run.mjs`, node).
//!
//! The host provides `env.log(ptr, len)` (one UTF-8 line) and `env.now()` (milliseconds).
//! Exports: `parity() -> u32` (failed checks; 0 = all match) and `bench()`.
//! Built with `-C target-feature=+simd128`, so `Isa::Simd128` is runnable beside `Scalar`.

#![cfg(target_arch = "wasm32")]

use spinkv_kernels::{parity as suite, runnable_isas};

mod host {
    #[link(wasm_import_module = "env")]
    extern "C" {
        pub(crate) fn log(ptr: *const u8, len: usize);
        pub(crate) fn now() -> f64;
    }
}

fn say(line: &str) {
    // SAFETY: the host reads `len` bytes at `ptr` from this module's memory, synchronously.
    unsafe { host::log(line.as_ptr(), line.len()) }
}

fn now_ms() -> f64 {
    // SAFETY: a plain host call without arguments.
    unsafe { host::now() }
}

/// Panics abort the module (wasm32 has no unwinding): say why first.
fn install_panic_hook() {
    std::panic::set_hook(Box::new(|info| say(&format!("panic: {info}"))));
}

/// Runs the parity suite on every ISA this build can run; returns the number of failures.
#[no_mangle]
pub extern "C" fn parity() -> u32 {
    install_panic_hook();
    let mut failures = 0;
    let isas = runnable_isas();
    say(&format!(
        "parity: isas {:?}",
        isas.iter().map(|i| i.name()).collect::<Vec<_>>()
    ));
    for isa in isas {
        for (name, check) in suite::OPS {
            let started = now_ms();
            match check(isa) {
                Ok(()) => say(&format!(
                    "ok   {isa:<8} {name:<14} ({:.0} ms)",
                    now_ms() - started
                )),
                Err(e) => {
                    failures += 1;
                    say(&format!("FAIL {isa:<8} {name:<14} {e}"));
                }
            }
        }
    }
    failures
}

/// The kernel benchmark (same cases as `cargo run --example kernel_bench`), every ISA.
#[no_mangle]
pub extern "C" fn bench() {
    install_panic_hook();
    for isa in runnable_isas() {
        for line in spinkv_kernels::bench::run(isa, &now_ms) {
            say(&line);
        }
    }
}
