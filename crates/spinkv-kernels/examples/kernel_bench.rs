//! Single-thread throughput of the matvec / matmul kernels on model-sized f16 matrices.
//!
//! cargo run --release -p spinkv-kernels --example kernel_bench [-- scalar|avx2]

use spinkv_kernels::{f16, matmul, matvec, select_isa, WeightRef};
use std::time::Instant;

fn main() {
    if let Some(name) = std::env::args().nth(1) {
        select_isa(&name).unwrap_or_else(|e| {
            eprintln!("{e}");
            std::process::exit(2)
        });
    }
    println!("isa {}", spinkv_kernels::active_isa());
    for &(rows, k) in &[(49152usize, 576usize), (1536, 576), (576, 1536)] {
        let w: Vec<f16> = (0..rows * k)
            .map(|i| f16::from_f32(((i % 97) as f32 - 48.0) / 97.0))
            .collect();
        let x: Vec<f32> = (0..k).map(|i| (i % 13) as f32 / 13.0).collect();
        let mut y = vec![0.0; rows];
        let reps = (200_000_000 / (rows * k)).max(3);
        let started = Instant::now();
        for _ in 0..reps {
            matvec(WeightRef::F16(&w), k, &x, 0..rows, &mut y);
        }
        let s = started.elapsed().as_secs_f64() / reps as f64;
        println!(
            "matvec {rows}x{k}: {:.3} ms, {:.1} GB/s of weights",
            s * 1e3,
            (rows * k * 2) as f64 / s / 1e9
        );
        let n_tokens = 64;
        let xs: Vec<f32> = (0..n_tokens * k).map(|i| (i % 13) as f32 / 13.0).collect();
        let rows_mm = rows.min(3072);
        let _ = &mut y;
        let mut ys = vec![0.0; n_tokens * rows_mm];
        let started = Instant::now();
        matmul(WeightRef::F16(&w), k, &xs, 0..rows_mm, &mut ys);
        let s = started.elapsed().as_secs_f64();
        println!(
            "matmul {n_tokens} tokens x {rows_mm}x{k}: {:.3} ms, {:.1} GFLOP/s",
            s * 1e3,
            (2 * n_tokens * rows_mm * k) as f64 / s / 1e9
        );
    }
}
