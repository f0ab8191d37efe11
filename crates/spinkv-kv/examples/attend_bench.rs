//! Decode-attention timing at several depths, one thread vs a team of one thread per core (µs
//! per call, the best of several batches).
//! `cargo run --release -p spinkv-kv --example attend_bench [preset] [depth]`
//! With SPINKV_AB=1, one thread alternates `spinkv_kernels::experiment`'s arms between batches
//! (A B B A ...) and prints each arm's median and best batch: an A/B inside one process.
//! SPINKV_LAYERS=N (default 1) gives the cache N layers and calls them in turn, as decode does:
//! with 30 layers at depth 7,680 the cache is larger than the L3, so the scans read DRAM.
//! SPINKV_CHUNK=T appends T tokens to every layer in turn (prefill appends 256, decode 1), so
//! the pages land in the pool in the order a session puts them there.
//! SPINKV_AB=cache builds a second cache with arm B selected and times the two caches in
//! alternating batches, arm A (one thread; the team too with SPINKV_POOL=1): an A/B of a
//! change to how a cache is built (page placement, say) rather than to how it is read.

use std::sync::Arc;
use std::time::Instant;

use spinkv_kernels::team::Team;
use spinkv_kv::{KvCache, KvConfig, KvShape};

/// Timed batches per measurement; the best is printed.
const BATCHES: usize = 9;

fn main() {
    let preset = std::env::args().nth(1).unwrap_or_else(|| "fp16".into());
    // SmolLM2-135M attention shape, one layer unless SPINKV_LAYERS says more.
    let layers = env_count("SPINKV_LAYERS").unwrap_or(1);
    let shape = KvShape {
        n_layers: layers,
        n_heads: 9,
        n_kv_heads: 3,
        head_dim: 64,
    };
    let config = KvConfig {
        max_tokens: 16384,
        ..KvConfig::preset(&preset).expect("preset")
    };
    // Without a team attention runs on the calling thread alone.
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let team = Arc::new(Team::new(cores).unwrap());
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
        let kv: Vec<f32> = (0..depth * shape.kv_width()).map(|_| rand()).collect();
        let chunk = env_count("SPINKV_CHUNK").unwrap_or(depth);
        let cache = filled(shape, &config, &kv, chunk);
        let q: Vec<f32> = (0..shape.q_width()).map(|_| rand()).collect();
        let mut out = vec![0.0; q.len()];
        let reps = (2_000_000 / depth).clamp(20, 20000);
        let mut turn = 0usize;
        let mut attend = |cache: &KvCache, out: &mut [f32]| {
            turn += 1;
            cache.attend(turn % layers, &q, depth - 1, out)
        };
        let mut time = |cache: &KvCache, out: &mut [f32]| {
            for _ in 0..reps / 10 {
                attend(cache, out).unwrap();
            }
            // The best of several batches: on a shared VM the mean moves with the neighbours'
            // load, the best batch much less.
            let batch = (reps / BATCHES).max(1);
            (0..BATCHES)
                .map(|_| per_call_us(batch, || attend(cache, out)))
                .fold(f64::INFINITY, f64::min)
        };
        if std::env::var("SPINKV_AB").is_ok_and(|v| v == "cache") {
            // The same calls on a second cache built under arm B, arm A while timing.
            spinkv_kernels::experiment::set_arm_b(true);
            let other = filled(shape, &config, &kv, chunk);
            spinkv_kernels::experiment::set_arm_b(false);
            let caches = [&cache, &other];
            let pool = std::env::var("SPINKV_POOL").is_ok_and(|v| v == "1");
            let [(a, _), (b, _)] = in_turns(reps, |arm, batch| {
                let mut go = || per_call_us(batch, || attend(caches[arm], &mut out));
                if pool {
                    team.install(go)
                } else {
                    go()
                }
            });
            println!(
                "depth {depth:5}: cache A {a:.1}  cache B {b:.1}  B/A {:.3}",
                b / a
            );
            continue;
        }
        if std::env::var("SPINKV_AB").is_ok_and(|v| v == "1") {
            ab(depth, reps, || attend(&cache, &mut out));
            continue;
        }
        let one = time(&cache, &mut out);
        let all = team.install(|| time(&cache, &mut out));
        let bytes = cache.stats().total.allocated_bytes as f64 / layers as f64;
        println!(
            "depth {depth:5}: 1 thread {one:8.1}  pool {all:8.1}  ({:.1} GB/s on pool)",
            bytes / all / 1e3
        );
    }
}

/// A positive count from the environment variable `name`, if it holds one.
fn env_count(name: &str) -> Option<usize> {
    let count: usize = std::env::var(name).ok()?.parse().ok()?;
    Some(count.max(1))
}

/// A cache holding `kv` (`[tokens][kv width]`, the same rows as keys and values) in every
/// layer, appended `chunk` tokens to each layer in turn after a first reservation and then
/// geometric growth, as the command line's sessions grow.
fn filled(shape: KvShape, config: &KvConfig, kv: &[f32], chunk: usize) -> KvCache {
    let mut cache = KvCache::new(shape, config.clone()).unwrap();
    cache.reserve(256);
    for rows in kv.chunks(chunk * shape.kv_width()) {
        for layer in 0..shape.n_layers {
            cache.append(layer, rows, rows).unwrap();
        }
    }
    cache
}

/// One thread, the experiment's arms in alternating batches (A B B A ...): each arm's median
/// and best µs per call, and B/A of the medians.
fn ab(depth: usize, reps: usize, mut call: impl FnMut() -> Result<(), spinkv_kv::KvError>) {
    use spinkv_kernels::experiment::set_arm_b;
    let [a, b] = in_turns(reps, |arm, batch| {
        set_arm_b(arm == 1);
        call().unwrap();
        per_call_us(batch, &mut call)
    });
    set_arm_b(false);
    println!(
        "depth {depth:5}: 1 thread A {:.1} (best {:.1})  B {:.1} (best {:.1})  B/A {:.3}",
        a.0,
        a.1,
        b.0,
        b.1,
        b.0 / a.0
    );
}

/// µs per call of `calls` calls in a row.
fn per_call_us(calls: usize, mut call: impl FnMut() -> Result<(), spinkv_kv::KvError>) -> f64 {
    let t = Instant::now();
    for _ in 0..calls {
        call().unwrap();
    }
    t.elapsed().as_secs_f64() * 1e6 / calls as f64
}

/// `8 · BATCHES` timed batches of `reps / BATCHES` calls, `batch_us(arm, calls)` for arms in
/// the order A B B A ... (µs per call); each arm's median and best.
fn in_turns(reps: usize, mut batch_us: impl FnMut(usize, usize) -> f64) -> [(f64, f64); 2] {
    let batch = (reps / BATCHES).max(1);
    let mut arms: [Vec<f64>; 2] = [Vec::new(), Vec::new()];
    for turn in 0..8 * BATCHES {
        let arm = spinkv_kernels::experiment::abba_arm(turn);
        arms[arm].push(batch_us(arm, batch));
    }
    arms.map(|mut v| {
        v.sort_by(f64::total_cmp);
        (v[v.len() / 2], v[0])
    })
}
