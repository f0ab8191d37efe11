//! Single-thread kernel throughput per ISA: decode matvec, key/value scans (fp16 and turbo
//! codes) in GB/s, append-time encoding in ns/token. The same cases run in node for simd128
//! (crates/spinkv-wasm) and under qemu for NEON (emulated: not a speed figure). Then the
//! prefill matmul of the active ISA on F16 weights at SmolLM2-135M's shapes, in GFLOP/s, and on
//! Q8_0 weights in GMAC/s.
//!
//! cargo run --release -p spinkv-kernels --example kernel_bench [-- scalar,avx2,avx512]
//! (`-- prefill-matmul` runs only the matmul case)

use spinkv_kernels::{runnable_isas, Isa};
use std::time::Instant;

fn main() {
    if std::env::args().nth(1).as_deref() == Some("prefill-matmul") {
        return prefill_matmul();
    }
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
    prefill_matmul();
}

/// Single-thread prefill matmul (`spinkv_kernels::matmul`, active ISA) over 256 tokens on F16
/// weights, at the projections' shapes of SmolLM2-135M (k × rows), best of 3 runs of 24
/// calls (long against the scheduler's accounting tick). Timed in
/// the thread's CPU time where Linux reports it (`/proc/thread-self/schedstat`), so a busy
/// machine slows the run without skewing the figure much; wall time elsewhere.
fn prefill_matmul() {
    use spinkv_kernels::{f16, matmul, WeightRef};
    const TOKENS: usize = 256;
    for (name, k, rows) in [
        ("q/k/v", 576, 960),
        ("gate/up", 576, 3072),
        ("down", 1536, 576),
    ] {
        let weights: Vec<f16> = (0..k * rows)
            .map(|i| f16::from_f32(((i * 7919 % 1999) as f32 / 1999.0 - 0.5) * 0.1))
            .collect();
        let x: Vec<f32> = (0..k * TOKENS)
            .map(|i| (i * 104_729 % 3001) as f32 / 3001.0 - 0.5)
            .collect();
        let mut y = vec![0.0f32; TOKENS * rows];
        let mut best = f64::INFINITY;
        const CALLS: usize = 24;
        for _ in 0..3 {
            let started = seconds_on_cpu();
            for _ in 0..CALLS {
                matmul(WeightRef::F16(&weights), k, &x, 0..rows, &mut y);
            }
            best = best.min(seconds_on_cpu() - started);
        }
        let gflops = 2.0 * (k * rows * TOKENS * CALLS) as f64 / best / 1e9;
        println!(
            "prefill matmul {} f16 {name} k={k} rows={rows} tokens={TOKENS}: {gflops:.1} GFLOP/s",
            spinkv_kernels::active_isa()
        );
        prefill_matmul_q8(name, k, rows, &x);
    }
}

/// The same shape on Q8_0 weights as the model runs it: the activations quantized once in the
/// kernel's order, the rows in eight tasks (what a 2-thread pool gives each fork-join), one
/// task after another.
fn prefill_matmul_q8(name: &str, k: usize, rows: usize, x: &[f32]) {
    use spinkv_kernels::q8dot::{matmul_quantized, CodeOrder, Q8Activations};
    use spinkv_kernels::{f16, Q8Weights, Q8_BLOCK};
    const TOKENS: usize = 256;
    const CALLS: usize = 24;
    let codes: Vec<i8> = (0..k * rows).map(|i| (i * 7919 % 255) as i8).collect();
    let scales: Vec<f16> = (0..k * rows / Q8_BLOCK)
        .map(|i| f16::from_f32(0.001 + (i % 97) as f32 * 1e-4))
        .collect();
    let w = Q8Weights::new(&codes, &scales).expect("one scale per block");
    let order = CodeOrder::for_isa(spinkv_kernels::active_isa());
    let xq = Q8Activations::quantize_in(x, k, order);
    let task_rows = (rows / 8).div_ceil(4) * 4;
    let mut y = vec![0.0f32; TOKENS * task_rows];
    let mut best = f64::INFINITY;
    for _ in 0..3 {
        let started = seconds_on_cpu();
        for _ in 0..CALLS {
            for start in (0..rows).step_by(task_rows) {
                let end = (start + task_rows).min(rows);
                matmul_quantized(w, k, &xq, start..end, &mut y[..TOKENS * (end - start)]);
            }
        }
        best = best.min(seconds_on_cpu() - started);
    }
    let gmacs = (k * rows * TOKENS * CALLS) as f64 / best / 1e9;
    println!(
        "prefill matmul {} q8_0 {name} k={k} rows={rows} tokens={TOKENS}, {task_rows}-row tasks: \
         {gmacs:.1} GMAC/s",
        spinkv_kernels::active_isa()
    );
}

/// This thread's time on a CPU in seconds (scheduler statistics), or wall time since the
/// first call where those are missing.
fn seconds_on_cpu() -> f64 {
    static ORIGIN: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        .map(|ns| ns as f64 / 1e9)
        .unwrap_or_else(|| ORIGIN.get_or_init(Instant::now).elapsed().as_secs_f64())
}
