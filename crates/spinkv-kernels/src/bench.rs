//! Kernel throughput per ISA, shared by `examples/kernel_bench.rs` (native) and the wasm
//! harness (crates/spinkv-wasm, timed by the JavaScript host): the decode hot loops of the
//! SmolLM2-135M shapes (head dim 64, 3 query heads per KV head, 32-token pages) and turbo's
//! rates (keys 3.5 bits, values 3 bits). Each case reports the best of several timed trials —
//! the machines this runs on are shared.

use crate::codes::{CodeLayout, Levels};
use crate::{codes, fwht, kv_accumulate, kv_score, matvec, quantize, scales, Isa, WeightRef};
use half::f16;

const D: usize = 64;
const N_QH: usize = 3;
const PAGE: usize = 32;
/// Query heads of one KV head in a prefill work item: 64 queries × 3 (a 256-token prefill split
/// four ways on 2 threads).
const PREFILL_HEADS: usize = 192;

/// Gaussian-like levels/thresholds of a `bits`-bit codebook for unit vectors of dim 64.
fn book(bits: u32) -> (Vec<f32>, Vec<f32>) {
    let n = 1usize << bits;
    let levels: Vec<f32> = (0..n)
        .map(|i| ((i as f32 + 0.5) / n as f32 - 0.5) * 0.5)
        .collect();
    let thresholds = levels.windows(2).map(|w| 0.5 * (w[0] + w[1])).collect();
    (levels, thresholds)
}

fn pseudo(i: usize) -> f32 {
    let x = (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 40;
    x as f32 / (1u64 << 24) as f32 - 0.5
}

/// Best seconds per call of `f` over a few trials of at least `min_ms` each.
fn time(now: &dyn Fn() -> f64, min_ms: f64, mut f: impl FnMut()) -> f64 {
    f();
    let mut best = f64::INFINITY;
    for _ in 0..5 {
        let start = now();
        let mut calls = 0u64;
        loop {
            f();
            calls += 1;
            let elapsed = now() - start;
            if elapsed >= min_ms {
                best = best.min(elapsed / 1e3 / calls as f64);
                break;
            }
        }
    }
    best
}

/// Runs every case on `isa` (which must be runnable) and returns one line per case.
/// `now` returns milliseconds from any fixed origin. The active ISA is left at `isa`.
pub fn run(isa: Isa, now: &dyn Fn() -> f64) -> Vec<String> {
    crate::set_isa(isa).expect("bench: ISA not runnable");
    let min_ms = if isa == Isa::Scalar { 20.0 } else { 40.0 };
    let mut lines = Vec::new();
    let mut say = |case: &str, value: String| lines.push(format!("{isa:<8} {case:<34} {value}"));

    // Decode matvec, the lm_head shape (the largest matrix; DRAM-bound).
    let (rows, k) = (49152usize, 576usize);
    let w: Vec<f16> = (0..rows * k).map(|i| f16::from_f32(pseudo(i))).collect();
    let x: Vec<f32> = (0..k).map(pseudo).collect();
    let mut y = vec![0.0f32; rows];
    let s = time(now, min_ms, || {
        matvec(WeightRef::F16(&w), k, &x, 0..rows, &mut y)
    });
    say(
        "matvec f16 49152x576",
        format!(
            "{:7.2} ms  {:6.1} GB/s",
            s * 1e3,
            (rows * k * 2) as f64 / s / 1e9
        ),
    );
    drop(w);

    // The same matrix as Q8_0: half the bytes, integer dot products (`crate::q8dot`).
    let codes: Vec<i8> = (0..rows * k).map(|i| (pseudo(i) * 127.0) as i8).collect();
    let scales: Vec<f16> = (0..rows * k / crate::Q8_BLOCK)
        .map(|i| f16::from_f32(0.01 + pseudo(i).abs() / 64.0))
        .collect();
    let q8 = crate::Q8Weights::new(&codes, &scales).expect("one scale per block");
    let s = time(now, min_ms, || {
        matvec(WeightRef::Q8_0(q8), k, &x, 0..rows, &mut y)
    });
    say(
        "matvec q8_0 49152x576",
        format!(
            "{:7.2} ms  {:6.1} GB/s",
            s * 1e3,
            (codes.len() + scales.len() * 2) as f64 / s / 1e9
        ),
    );
    drop(codes);

    // Q8_0 on an MLP-sized matrix that stays in L2 (compute, not DRAM), the activations
    // quantized beforehand as the model does: one token (decode), then 64 (a prefill tile).
    let (rows, k) = (1536usize, 576usize);
    let codes: Vec<i8> = (0..rows * k).map(|i| (pseudo(i) * 127.0) as i8).collect();
    let scales: Vec<f16> = (0..rows * k / crate::Q8_BLOCK)
        .map(|i| f16::from_f32(0.01 + pseudo(i).abs() / 64.0))
        .collect();
    let q8 = crate::Q8Weights::new(&codes, &scales).expect("one scale per block");
    for n_tokens in [1usize, 64] {
        let x: Vec<f32> = (0..n_tokens * k).map(|i| pseudo(i + 3)).collect();
        let order = crate::q8dot::CodeOrder::for_isa(isa);
        let xq = crate::q8dot::Q8Activations::quantize_in(&x, k, order);
        let mut y = vec![0.0f32; n_tokens * rows];
        let s = time(now, min_ms, || {
            crate::q8dot::matmul_quantized(q8, k, &xq, 0..rows, &mut y)
        });
        say(
            &format!("q8_0 1536x576 x{n_tokens} tok (L2)"),
            format!(
                "{:7.3} ms  {:6.1} GMAC/s",
                s * 1e3,
                (rows * k * n_tokens) as f64 / s / 1e9
            ),
        );
    }
    drop(codes);

    // Prefill's batched matmul on f16 weights (the MLP shape, 64 tokens: a tile sweep in L2).
    let w: Vec<f16> = (0..rows * k)
        .map(|i| f16::from_f32(pseudo(i + 5)))
        .collect();
    let n_tokens = 64;
    let x: Vec<f32> = (0..n_tokens * k).map(|i| pseudo(i + 3)).collect();
    let mut y = vec![0.0f32; n_tokens * rows];
    let s = time(now, min_ms, || {
        crate::matmul(WeightRef::F16(&w), k, &x, 0..rows, &mut y)
    });
    say(
        &format!("matmul f16 1536x576 x{n_tokens} tok"),
        format!(
            "{:7.3} ms  {:6.1} GMAC/s",
            s * 1e3,
            (rows * k * n_tokens) as f64 / s / 1e9
        ),
    );
    drop(w);

    // A long context for one KV head: 8192 tokens in 32-token pages.
    let tokens = 8192usize;
    let queries: Vec<f32> = (0..N_QH * D).map(|i| pseudo(i + 7)).collect();
    let mut scores = vec![0.0f32; N_QH * PAGE];
    let mut acc = vec![0.0f32; N_QH * D];
    let weights: Vec<f32> = (0..N_QH * PAGE).map(|i| 0.01 + pseudo(i).abs()).collect();

    let keys: Vec<f16> = (0..tokens * D).map(|i| f16::from_f32(pseudo(i))).collect();
    let s = time(now, min_ms, || {
        for page in keys.chunks_exact(PAGE * D) {
            kv_score::score_f16(page, D, &queries, &mut scores, PAGE);
        }
    });
    say(
        "key scan fp16 (8192 tok, 3 qh)",
        rate(tokens * D * 2, tokens, s),
    );
    let s = time(now, min_ms, || {
        for page in keys.chunks_exact(PAGE * D) {
            kv_accumulate::accumulate_f16(page, D, &weights, PAGE, &mut acc);
        }
    });
    say(
        "value scan fp16 (8192 tok, 3 qh)",
        rate(tokens * D * 2, tokens, s),
    );
    drop(keys);

    let (hi_levels, hi_thresholds) = book(4);
    let (lo_levels, lo_thresholds) = book(3);
    let levels = Levels {
        hi: &hi_levels,
        lo: &lo_levels,
    };
    let thresholds = Levels {
        hi: &hi_thresholds,
        lo: &lo_thresholds,
    };
    let key_layout = CodeLayout::for_half_bits(D, 7);
    let value_layout = CodeLayout::for_half_bits(D, 6);
    let value_levels = Levels {
        hi: &lo_levels,
        lo: &lo_levels,
    };
    let mut packed_keys = vec![0u8; tokens * key_layout.bytes()];
    let mut packed_values = vec![0u8; tokens * value_layout.bytes()];
    let mut code = vec![0u8; D];
    for j in 0..tokens {
        for (c, v) in code.iter_mut().enumerate() {
            *v = (pseudo(j * D + c).to_bits() % (1 << key_layout.width(c))) as u8;
        }
        let kb = key_layout.bytes();
        codes::pack(&code, &key_layout, &mut packed_keys[j * kb..(j + 1) * kb]);
        let vb = value_layout.bytes();
        for v in code.iter_mut() {
            *v &= 7;
        }
        codes::pack(
            &code,
            &value_layout,
            &mut packed_values[j * vb..(j + 1) * vb],
        );
    }
    let log_scales: Vec<u8> = (0..tokens).map(|j| (j % 255 + 1) as u8).collect();
    let mut page_scales = [0.0f32; PAGE];
    let kb = key_layout.bytes() * PAGE;
    let s = time(now, min_ms, || {
        for (page, side) in packed_keys
            .chunks_exact(kb)
            .zip(log_scales.chunks_exact(PAGE))
        {
            scales::decode_log_u8(side, -2.0, 0.02, &mut page_scales);
            kv_score::score_codes(
                page,
                &key_layout,
                levels,
                &page_scales,
                &queries,
                &mut scores,
                PAGE,
            );
        }
    });
    say(
        "key scan turbo K3.5 (8192 tok, 3 qh)",
        rate(tokens * (key_layout.bytes() + 1), tokens, s),
    );
    let vb = value_layout.bytes() * PAGE;
    let s = time(now, min_ms, || {
        for (page, side) in packed_values
            .chunks_exact(vb)
            .zip(log_scales.chunks_exact(PAGE))
        {
            scales::decode_log_u8(side, -2.0, 0.02, &mut page_scales);
            kv_accumulate::accumulate_codes(
                page,
                &value_layout,
                value_levels,
                &page_scales,
                &weights,
                PAGE,
                &mut acc,
            );
        }
    });
    say(
        "value scan turbo V3 (8192 tok, 3 qh)",
        rate(tokens * (value_layout.bytes() + 1), tokens, s),
    );

    // The same scans as the attention loop runs them: integer key scores and narrow value
    // tiles, one call per 32-token page against one call per tile of 8 pages (256 tokens,
    // the pages stored apart as in the cache's pool), scales decoded per page.
    let int_levels = kv_score::int_dot::IntLevels::new(&key_layout, levels).expect("K3.5 fits");
    let qlen = kv_score::int_dot::query_len(&key_layout);
    let (int_query, factors) = quantized_queries(&key_layout, &int_levels, &queries);
    let int_queries = kv_score::int_dot::IntQueries {
        n_qh: N_QH,
        values: &int_query,
        value_stride: qlen,
        factors: &factors,
        factor_stride: 1,
    };
    const TILE: usize = 8;
    let mut tile_scales = [0.0f32; TILE * PAGE];
    let mut tile_scores = vec![0.0f32; N_QH * TILE * PAGE];
    let tile_weights: Vec<f32> = (0..N_QH * TILE * PAGE)
        .map(|i| 0.01 + pseudo(i).abs())
        .collect();
    let key_pages: Vec<&[u8]> = packed_keys.chunks_exact(kb).collect();
    let value_pages: Vec<&[u8]> = packed_values.chunks_exact(vb).collect();
    let sides: Vec<&[u8]> = log_scales.chunks_exact(PAGE).collect();
    for tile in [1, TILE] {
        let s = time(now, min_ms, || {
            for (pages, sides) in key_pages.chunks(tile).zip(sides.chunks(tile)) {
                for (side, out) in sides.iter().zip(tile_scales.chunks_exact_mut(PAGE)) {
                    scales::decode_log_u8(side, -2.0, 0.02, out);
                }
                let rows = kv_score::int_dot::IntRows {
                    pages,
                    page_rows: PAGE,
                    layout: &key_layout,
                    levels: &int_levels,
                    scales: &tile_scales[..tile * PAGE],
                };
                kv_score::int_dot::score_codes_int(
                    rows,
                    int_queries,
                    &mut tile_scores,
                    tile * PAGE,
                );
            }
        });
        say(
            &format!("key scan turbo int K3.5 ({tile} pg/call)"),
            rate(tokens * (key_layout.bytes() + 1), tokens, s),
        );
        let s = time(now, min_ms, || {
            for (pages, sides) in value_pages.chunks(tile).zip(sides.chunks(tile)) {
                for (side, out) in sides.iter().zip(tile_scales.chunks_exact_mut(PAGE)) {
                    scales::decode_log_u8(side, -2.0, 0.02, out);
                }
                kv_accumulate::accumulate_code_pages(
                    pages,
                    PAGE,
                    &value_layout,
                    value_levels,
                    &tile_scales[..tile * PAGE],
                    &tile_weights,
                    tile * PAGE,
                    &mut acc,
                );
            }
        });
        say(
            &format!("value scan turbo V3 ({tile} pg/call)"),
            rate(tokens * (value_layout.bytes() + 1), tokens, s),
        );
    }

    // Prefill's scans: 64 queries × 3 query heads of one KV head (an item of a 256-token prefill
    // on 2 threads) against a 256-token tile, sealed pages scanned as the attention loop does
    // (one key call per tile, one value call per page: past the narrow tiles' head limit) and
    // fp16 pages one by one.
    let heads = PREFILL_HEADS;
    let tile_rows = TILE * PAGE;
    let mut prefill_scores = vec![0.0f32; heads * tile_rows];
    let prefill_weights: Vec<f32> = (0..heads * tile_rows)
        .map(|i| 0.01 + pseudo(i + 11).abs())
        .collect();
    let prefill_queries: Vec<f32> = (0..heads * D).map(|i| pseudo(i + 13)).collect();
    let mut prefill_acc = vec![0.0f32; heads * D];
    let (heads_query, heads_factors) =
        quantized_queries(&key_layout, &int_levels, &prefill_queries);
    for (side, out) in sides.iter().zip(tile_scales.chunks_exact_mut(PAGE)) {
        scales::decode_log_u8(side, -2.0, 0.02, out);
    }
    let s = time(now, min_ms, || {
        let rows = kv_score::int_dot::IntRows {
            pages: &key_pages[..TILE],
            page_rows: PAGE,
            layout: &key_layout,
            levels: &int_levels,
            scales: &tile_scales,
        };
        let queries = kv_score::int_dot::IntQueries {
            n_qh: heads,
            values: &heads_query,
            value_stride: qlen,
            factors: &heads_factors,
            factor_stride: 1,
        };
        kv_score::int_dot::score_codes_int(rows, queries, &mut prefill_scores, tile_rows);
    });
    say(
        &format!("prefill key scan int K3.5 ({heads} qh)"),
        per_head(tile_rows, heads, s),
    );
    let s = time(now, min_ms, || {
        for (p, page) in value_pages[..TILE].iter().enumerate() {
            kv_accumulate::accumulate_code_pages(
                &[page],
                PAGE,
                &value_layout,
                value_levels,
                &tile_scales[p * PAGE..(p + 1) * PAGE],
                &prefill_weights[p * PAGE..],
                tile_rows,
                &mut prefill_acc,
            );
        }
    });
    say(
        &format!("prefill value scan V3 ({heads} qh)"),
        per_head(tile_rows, heads, s),
    );
    let fp16_page: Vec<f16> = (0..PAGE * D)
        .map(|i| f16::from_f32(pseudo(i + 17)))
        .collect();
    let s = time(now, min_ms, || {
        for p in 0..TILE {
            let scores = &mut prefill_scores[p * PAGE..];
            kv_score::score_f16(&fp16_page, D, &prefill_queries, scores, tile_rows);
        }
    });
    say(
        &format!("prefill key scan fp16 ({heads} qh)"),
        per_head(tile_rows, heads, s),
    );
    let s = time(now, min_ms, || {
        for p in 0..TILE {
            let weights = &prefill_weights[p * PAGE..];
            kv_accumulate::accumulate_f16(&fp16_page, D, weights, tile_rows, &mut prefill_acc);
        }
    });
    say(
        &format!("prefill value scan fp16 ({heads} qh)"),
        per_head(tile_rows, heads, s),
    );

    // Append-time encoding of one token's key (the codec's steps: norm, rotate, snap, pack).
    let signs: Vec<f32> = (0..D)
        .map(|i| if pseudo(i) > 0.0 { 1.0 } else { -1.0 })
        .collect();
    let rows_in: Vec<f32> = (0..PAGE * D).map(|i| pseudo(i + 3)).collect();
    let mut y = vec![0.0f32; D];
    let mut recon = vec![0.0f32; D];
    let mut out = vec![0u8; key_layout.bytes()];
    let s = time(now, min_ms, || {
        for row in rows_in.chunks_exact(D) {
            let norm = row.iter().map(|v| v * v).sum::<f32>().sqrt();
            let inv = if norm > 0.0 { 1.0 / norm } else { 0.0 };
            for (yi, xi) in y.iter_mut().zip(row) {
                *yi = xi * inv;
            }
            fwht::signed_fwht(&mut y, &signs);
            quantize::quantize(&y, &key_layout, thresholds, levels, &mut code, &mut recon);
            codes::pack(&code, &key_layout, &mut out);
        }
    }) / PAGE as f64;
    say(
        "encode turbo key (1 token, d 64)",
        format!("{:7.1} ns/token", s * 1e9),
    );
    lines
}

/// Each head of `queries` (`[n_qh][D]`) quantised for the integer key scan: the int16s
/// (`query_len` a head) and each head's factor.
fn quantized_queries(
    layout: &CodeLayout,
    levels: &kv_score::int_dot::IntLevels,
    queries: &[f32],
) -> (Vec<i16>, Vec<f32>) {
    let qlen = kv_score::int_dot::query_len(layout);
    let n_qh = queries.len() / D;
    let mut values = vec![0i16; n_qh * qlen];
    let factors = values
        .chunks_exact_mut(qlen)
        .zip(queries.chunks_exact(D))
        .map(|(q, query)| kv_score::int_dot::quantize_query(layout, levels, query, q))
        .collect();
    (values, factors)
}

/// Time per token (all `heads` query heads, as the other scan lines' tokens cover their 3), and
/// the multiply-adds per second that makes (head dim 64).
fn per_head(tokens: usize, heads: usize, seconds: f64) -> String {
    format!(
        "{:7.1} ns/token  {:5.1} GMAC/s",
        seconds * 1e9 / tokens as f64,
        (tokens * heads * D) as f64 / seconds / 1e9
    )
}

fn rate(bytes: usize, tokens: usize, seconds: f64) -> String {
    format!(
        "{:6.2} GB/s  {:6.2} ns/token",
        bytes as f64 / seconds / 1e9,
        seconds * 1e9 / tokens as f64
    )
}
