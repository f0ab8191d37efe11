//! Single-thread kernel throughput per ISA: decode matvec, key/value scans (fp16 and turbo
//! codes) in GB/s, append-time encoding in ns/token. The same cases run in node for simd128
//! (crates/spinkv-wasm) and under qemu for NEON (emulated: not a speed figure).
//!
//! cargo run --release -p spinkv-kernels --example kernel_bench [-- scalar,avx2,avx512]

use spinkv_kernels::{runnable_isas, Isa};
use std::time::Instant;

fn main() {
    let isas: Vec<Isa> = match std::env::args().nth(1) {
        Some(list) => list
            .split(',')
            .map(|name| {
                spinkv_kernels::select_isa(name).unwrap_or_else(|e| {
                    eprintln!("{e}");
                    std::process::exit(2)
                })
            })
            .collect(),
        None => runnable_isas(),
    };
    println!("cpu features: {}", spinkv_kernels::cpu_features().join(" "));
    let origin = Instant::now();
    let now = || origin.elapsed().as_secs_f64() * 1e3;
    for isa in isas {
        for line in spinkv_kernels::bench::run(isa, &now) {
            println!("{line}");
        }
    }
}
