//! Prefill `depth` tokens, then time greedy decode steps.
//!
//! cargo run --release -p spinkv-model --example decode_bench -- MODEL_DIR [depth=512] [steps=64] [runs=3] [threads=0]
//! Set SPINKV_ISA=scalar|avx2|avx512 to compare kernels, SPINKV_KV=SPEC for the cache (a `--kv`
//! spec: fp16, turbo, turbo:sparse_v=0, ...), SPINKV_PROFILE=1 for the KV phases' thread-ms, of
//! the prefill and per decode token (a clock read per page phase: a profiled run is slower than
//! an unprofiled one) and the value blocks sparse values left out, SPINKV_AB=1 to alternate
//! `spinkv_kernels::experiment`'s two arms every 32 decode steps (A B B A A B B A ...) and print
//! each arm's time per token, and its attention and matmul ms (an A/B of a change inside one
//! process: see that module);
//! SPINKV_PREFILL_AFTER=N times the prefill of the prompt's tokens after the first N, which an
//! untimed prefill writes first (as `spinkv bench`'s prefill at a depth does);
//! SPINKV_AB=prefill alternates the arms between `runs` prefills instead; SPINKV_KV_B=SPEC
//! decodes with two caches (SPINKV_KV's and this one) in alternating turns in one process.
//! SPINKV_PROMPT_TOKENS=FILE takes the prompt from a file of whitespace-separated token ids
//! (real text, tokenized beforehand) instead of pseudo-text: attention weights depend on the
//! text, and so does what a change that reads them (skipping, splitting) measures.

use spinkv_kernels::experiment::abba_arm;
use spinkv_model::{set_threads, threads, KvConfig, Model, Session};
use std::path::PathBuf;
use std::time::Instant;

/// Decode steps per turn of each arm under SPINKV_AB: a page's worth, so each turn seals one
/// page (a step that seals one is ~3 ms slower; turns of 4 steps put every sealing step in
/// the same arm and read 2 % apart with both arms running the same code).
const AB_STEPS: usize = 32;

fn arg(args: &[String], i: usize, default: usize) -> usize {
    args.get(i).and_then(|s| s.parse().ok()).unwrap_or(default)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let Some(dir) = args.get(1) else {
        eprintln!("usage: decode_bench MODEL_DIR [depth] [steps] [runs] [threads]");
        std::process::exit(2);
    };
    let (depth, steps, runs) = (arg(&args, 2, 512), arg(&args, 3, 64), arg(&args, 4, 3));
    if let Err(e) = set_threads(arg(&args, 5, 0)) {
        eprintln!("error: {e}");
        std::process::exit(2);
    }
    let preset = std::env::var("SPINKV_KV").unwrap_or_else(|_| "fp16".into());
    let kv = match kv_config(&preset) {
        Ok(kv) => kv,
        Err(e) => {
            eprintln!("error: SPINKV_KV: {e}");
            std::process::exit(2);
        }
    };
    let loaded = Instant::now();
    let model = match Model::load(&PathBuf::from(dir)) {
        Ok(m) => m,
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(2);
        }
    };
    let vocab = model.config().vocab_size as u32;
    println!(
        "model {dir}: {} layers, dtype {}, load {:.0} ms, isa {}, threads {}",
        model.config().num_hidden_layers,
        model.dtype().name(),
        loaded.elapsed().as_secs_f64() * 1e3,
        spinkv_kernels::active_isa(),
        threads()
    );
    let prompt = match std::env::var("SPINKV_PROMPT_TOKENS") {
        Ok(path) => match text_tokens(&path, depth, vocab) {
            Ok(tokens) => tokens,
            Err(e) => {
                eprintln!("error: SPINKV_PROMPT_TOKENS {path}: {e}");
                std::process::exit(2);
            }
        },
        // Deterministic pseudo-text: spread over the vocabulary, avoiding the special ids.
        Err(_) => (0..depth as u32)
            .map(|i| 100 + (i * 7919) % (vocab - 100))
            .collect(),
    };
    let profile = std::env::var("SPINKV_PROFILE").is_ok_and(|v| v == "1");
    if std::env::var("SPINKV_AB").is_ok_and(|v| v == "prefill") {
        return prefill_ab(&model, &kv, &prompt, runs);
    }
    if let Ok(other) = std::env::var("SPINKV_KV_B") {
        let kv_b = match kv_config(&other) {
            Ok(kv) => kv,
            Err(e) => {
                eprintln!("error: SPINKV_KV_B: {e}");
                std::process::exit(2);
            }
        };
        return caches_ab(&model, [&kv, &kv_b], &prompt, steps);
    }
    let ab = std::env::var("SPINKV_AB").is_ok_and(|v| v == "1");
    let (prefix, timed) = prompt.split_at(prefill_after(prompt.len()));
    let mut decode_rates = Vec::new();
    let mut prefill_rates = Vec::new();
    for run in 0..runs {
        let mut session = Session::new(model.clone(), kv.clone()).expect("session");
        if !prefix.is_empty() {
            session.prefill(prefix, false).expect("prefill");
            session.reset_timings();
        }
        session.set_kv_profiling(profile);
        let started = Instant::now();
        session.prefill(timed, false).expect("prefill");
        let prefill_s = started.elapsed().as_secs_f64();
        let p = session.timings().clone();
        println!(
            "  prefill split: attention {:.0} ms, matmul {:.0} ms, other {:.0} ms",
            p.attention_ns as f64 / 1e6,
            p.matmul_ns as f64 / 1e6,
            p.other_ns as f64 / 1e6
        );
        if let Some(phases) = session.kv_phase_times() {
            println!("  prefill kv thread-ms: {}", phase_list(&phases, 1));
        }
        session.reset_timings();
        session.set_kv_profiling(profile);
        let started = Instant::now();
        // Seconds and steps of arms A and B (all in A without SPINKV_AB), and their attention
        // and matmul nanoseconds.
        let mut arms = [(0.0f64, 0usize); 2];
        let mut phases = [(0u64, 0u64); 2];
        for step in 0..steps {
            // The uncounted first turn is turn 1 of the order: B, then A A B B ...
            let arm = if ab { abba_arm(step / AB_STEPS + 1) } else { 0 };
            spinkv_kernels::experiment::set_arm_b(arm == 1);
            let step_started = Instant::now();
            let before = session.timings().clone();
            let next = argmax(session.last_logits());
            session.decode(next).expect("decode");
            // The first turn after the prefill (cold caches, waking threads) counts for neither.
            if step >= AB_STEPS {
                arms[arm].0 += step_started.elapsed().as_secs_f64();
                arms[arm].1 += 1;
                let after = session.timings();
                phases[arm].0 += after.attention_ns - before.attention_ns;
                phases[arm].1 += after.matmul_ns - before.matmul_ns;
            }
        }
        spinkv_kernels::experiment::set_arm_b(false);
        let decode_s = started.elapsed().as_secs_f64();
        if ab {
            let per_token = |(s, n): (f64, usize)| s * 1e3 / n.max(1) as f64;
            let (a, b) = (per_token(arms[0]), per_token(arms[1]));
            println!(
                "  A/B ms per token: A {a:.3} ({} steps), B {b:.3} ({} steps), B/A {:.3}",
                arms[0].1,
                arms[1].1,
                b / a
            );
            let split = |arm: usize| {
                let per = |ns: u64| ns as f64 / 1e6 / arms[arm].1.max(1) as f64;
                format!(
                    "attention {:.2}, matmul {:.2}",
                    per(phases[arm].0),
                    per(phases[arm].1)
                )
            };
            println!("  A/B ms per token: A {}; B {}", split(0), split(1));
        }
        let t = session.timings();
        let ms = |ns: u64| ns as f64 / 1e6;
        println!(
            "run {run}: prefill {} tok {:.1} tok/s | decode {steps} tok at depth {depth}: {:.1} tok/s \
             (per token: attention {:.2} ms, matmul {:.2} ms, other {:.2} ms)",
            timed.len(),
            timed.len() as f64 / prefill_s,
            steps as f64 / decode_s,
            ms(t.attention_ns) / steps as f64,
            ms(t.matmul_ns) / steps as f64,
            ms(t.other_ns) / steps as f64,
        );
        if let Some(phases) = session.kv_phase_times() {
            println!("  kv thread-ms per token: {}", phase_list(&phases, steps));
        }
        prefill_rates.push(timed.len() as f64 / prefill_s);
        decode_rates.push(steps as f64 / decode_s);
    }
    println!(
        "median: prefill {:.1} tok/s, decode {:.1} tok/s",
        median(&mut prefill_rates),
        median(&mut decode_rates)
    );
}

/// SPINKV_AB=prefill: `runs` prefills of the prompt in fresh sessions, the arms in the order
/// B A A B B A ... (turn 2 on; the first run warms up and counts for neither); prints each
/// arm's rate.
fn prefill_ab(model: &std::sync::Arc<Model>, kv: &KvConfig, prompt: &[u32], runs: usize) {
    let (prefix, timed) = prompt.split_at(prefill_after(prompt.len()));
    let mut arms = [(0.0f64, 0usize); 2];
    for run in 0..=runs {
        let arm = abba_arm(run + 2);
        spinkv_kernels::experiment::set_arm_b(arm == 1);
        let mut session = Session::new(model.clone(), kv.clone()).expect("session");
        if !prefix.is_empty() {
            session.prefill(prefix, false).expect("prefill");
        }
        let started = Instant::now();
        session.prefill(timed, false).expect("prefill");
        if run > 0 {
            arms[arm].0 += started.elapsed().as_secs_f64();
            arms[arm].1 += 1;
        }
    }
    spinkv_kernels::experiment::set_arm_b(false);
    let rate = |(s, n): (f64, usize)| (n * timed.len()) as f64 / s.max(f64::MIN_POSITIVE);
    let (a, b) = (rate(arms[0]), rate(arms[1]));
    println!(
        "  A/B prefill tok/s: A {a:.1} ({} runs), B {b:.1} ({} runs), B/A {:.3}",
        arms[0].1,
        arms[1].1,
        b / a
    );
}

/// SPINKV_KV_B=PRESET: two sessions, SPINKV_KV's cache (A) and this one (B), prefilled
/// alike, then decoding in turns of [`AB_STEPS`] steps (A B B A ...; the first turn of each
/// uncounted); prints each one's attention and matmul ms per token.
fn caches_ab(model: &std::sync::Arc<Model>, kvs: [&KvConfig; 2], prompt: &[u32], steps: usize) {
    let mut sessions: Vec<Session> = kvs
        .iter()
        .map(|kv| {
            let mut session = Session::new(model.clone(), (*kv).clone()).expect("session");
            session.prefill(prompt, false).expect("prefill");
            session
        })
        .collect();
    // [arm] = (seconds, attention ns, matmul ns, steps)
    let mut totals = [(0.0f64, 0u64, 0u64, 0usize); 2];
    for turn in 0..(2 * steps).div_ceil(AB_STEPS) {
        let arm = abba_arm(turn);
        let session = &mut sessions[arm];
        let before = session.timings().clone();
        let started = Instant::now();
        for _ in 0..AB_STEPS {
            let next = argmax(session.last_logits());
            session.decode(next).expect("decode");
        }
        if turn >= 2 {
            let t = session.timings();
            let total = &mut totals[arm];
            total.0 += started.elapsed().as_secs_f64();
            total.1 += t.attention_ns - before.attention_ns;
            total.2 += t.matmul_ns - before.matmul_ns;
            total.3 += AB_STEPS;
        }
    }
    for (name, (s, attention, matmul, n)) in ["A", "B"].iter().zip(totals) {
        let n = n.max(1) as f64;
        println!(
            "  {name}: {:.3} ms per token (attention {:.2} ms, matmul {:.2} ms), {n} steps",
            s * 1e3 / n,
            attention as f64 / 1e6 / n,
            matmul as f64 / 1e6 / n
        );
    }
}

fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in logits.iter().enumerate() {
        if v > logits[best] {
            best = i;
        }
    }
    best as u32
}

/// A cache spec as the CLI's `--kv` takes it: a preset and settings (`turbo:sparse_v=0`).
fn kv_config(spec: &str) -> Result<KvConfig, spinkv_kv::KvError> {
    let (options, _) = spinkv_kv::KvOptions::parse_spec(spec)?;
    KvConfig::from_options(&options, None)
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// The first `depth` token ids of a whitespace-separated file, each below `vocab`.
fn text_tokens(path: &str, depth: usize, vocab: u32) -> Result<Vec<u32>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| e.to_string())?;
    let tokens = text
        .split_whitespace()
        .take(depth)
        .map(|t| match t.parse::<u32>() {
            Ok(id) if id < vocab => Ok(id),
            _ => Err(format!("{t:?} is not a token id below {vocab}")),
        })
        .collect::<Result<Vec<u32>, String>>()?;
    if tokens.len() < depth {
        return Err(format!("{} tokens, {depth} wanted", tokens.len()));
    }
    Ok(tokens)
}

/// The KV phases that took any time, each as thread-ms per `per` (steps, or 1 for a total).
fn phase_list(phases: &spinkv_kv::PhaseTimes, per: usize) -> String {
    let listed: Vec<String> = phases
        .as_pairs()
        .iter()
        .filter(|(_, ns)| *ns > 0)
        .map(|(name, ns)| {
            let name = name.trim_end_matches("_ns");
            format!("{name} {:.2}", *ns as f64 / 1e6 / per.max(1) as f64)
        })
        .collect();
    match phases.value_blocks_skipped_pct() {
        Some(pct) => format!("{}; value blocks skipped {pct:.1} %", listed.join(", ")),
        None => listed.join(", "),
    }
}

/// Untimed prompt tokens before a timed prefill (SPINKV_PREFILL_AFTER, at most `len`).
fn prefill_after(len: usize) -> usize {
    std::env::var("SPINKV_PREFILL_AFTER")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
        .min(len)
}
