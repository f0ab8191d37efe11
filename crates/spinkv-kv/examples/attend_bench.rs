//! Decode-attention timing at several depths, one thread vs the global pool.
//! `cargo run --release -p spinkv-kv --example attend_bench [preset] [depth]`

use std::time::Instant;

use spinkv_kv::{KvCache, KvConfig, KvShape};

fn main() {
    let preset = std::env::args().nth(1).unwrap_or_else(|| "fp16".into());
    // SmolLM2-135M attention shape, one layer.
    let shape = KvShape {
        n_layers: 1,
        n_heads: 9,
        n_kv_heads: 3,
        head_dim: 64,
    };
    let config = KvConfig {
        max_tokens: 16384,
        ..KvConfig::preset(&preset).expect("preset")
    };
    let single = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .unwrap();
    let mut seed = 1u32;
    let mut rand = move || {
        seed ^= seed << 13;
        seed ^= seed >> 17;
        seed ^= seed << 5;
        (seed as f32 / u32::MAX as f32) * 2.0 - 1.0
    };
    println!("preset {preset}: decode attend (1 query, 9 heads, d 64), µs per call");
    let depths = match std::env::args().nth(2).and_then(|s| s.parse().ok()) {
        Some(depth) => vec![depth],
        None => vec![64usize, 128, 256, 512, 1024, 2048, 4096, 8192],
    };
    for depth in depths {
        let mut cache = KvCache::new(shape, config.clone()).unwrap();
        let kv: Vec<f32> = (0..depth * shape.kv_width()).map(|_| rand()).collect();
        cache.append(0, &kv, &kv).unwrap();
        let q: Vec<f32> = (0..shape.q_width()).map(|_| rand()).collect();
        let mut out = vec![0.0; q.len()];
        let reps = (2_000_000 / depth).clamp(20, 20000);
        let time = |cache: &KvCache, out: &mut [f32]| {
            for _ in 0..reps / 10 {
                cache.attend(0, &q, depth - 1, out).unwrap();
            }
            let t = Instant::now();
            for _ in 0..reps {
                cache.attend(0, &q, depth - 1, out).unwrap();
            }
            t.elapsed().as_secs_f64() * 1e6 / reps as f64
        };
        let one = single.install(|| time(&cache, &mut out));
        let all = time(&cache, &mut out);
        let bytes = cache.stats().total.allocated_bytes as f64;
        println!(
            "depth {depth:5}: 1 thread {one:8.1}  pool {all:8.1}  ({:.1} GB/s on pool)",
            bytes / all / 1e3
        );
    }
}
