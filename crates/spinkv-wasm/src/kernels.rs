//! The kernel parity suite (every SIMD128 kernel against its scalar reference) and the kernel
//! benchmark, as `run.mjs parity|bench` calls them.

use spinkv_kernels::{parity as suite, runnable_isas};

use crate::host::{install, now_ms, say};

/// Runs the parity suite on every ISA this build can run; returns the number of failures.
#[no_mangle]
pub extern "C" fn parity() -> u32 {
    install();
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
    install();
    for isa in runnable_isas() {
        for line in spinkv_kernels::bench::run(isa, &now_ms) {
            say(&line);
        }
    }
}
