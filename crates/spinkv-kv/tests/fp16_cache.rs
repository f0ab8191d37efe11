//! The fp16 cache against a naive f64 attention, plus lifecycle, errors and accounting.

mod common;

use common::{max_abs_diff, reference_attention, round_f16, Rng};
use spinkv_kv::{KvCache, KvConfig, KvError, KvShape};

const SHAPE: KvShape = KvShape {
    n_layers: 2,
    n_heads: 6,
    n_kv_heads: 2,
    head_dim: 16,
};

fn config(page_tokens: usize, max_tokens: usize) -> KvConfig {
    KvConfig {
        page_tokens,
        max_tokens,
        ..KvConfig::fp16()
    }
}

/// Appends `chunks` of random tokens to every layer, checking after each append that attention
/// of the new tokens (and of a window reaching back before the chunk) matches the reference.
fn check_against_reference(
    shape: KvShape,
    page_tokens: usize,
    chunks: &[usize],
    key_scale: f64,
    seed: u64,
) {
    let mut rng = Rng::new(seed);
    let mut cache = KvCache::new(shape, config(page_tokens, 4096)).unwrap();
    let width = shape.n_kv_heads * shape.head_dim;
    let qwidth = shape.n_heads * shape.head_dim;
    let mut keys = vec![Vec::new(); shape.n_layers];
    let mut values = vec![Vec::new(); shape.n_layers];
    for &n in chunks {
        let start = cache.len();
        for layer in 0..shape.n_layers {
            let k = rng.normals(n * width, key_scale);
            let v = rng.normals(n * width, 1.0);
            cache.append(layer, &k, &v).unwrap();
            keys[layer].extend(round_f16(&k));
            values[layer].extend(round_f16(&v));
            // The new tokens' queries, plus a query batch starting earlier (start > 0, n > 1).
            let back = start.saturating_sub(3);
            for q_start in [start, back] {
                let n_q = start + n - q_start;
                let q = rng.normals(n_q * qwidth, 1.0);
                let mut out = vec![f32::NAN; q.len()];
                cache.attend(layer, &q, q_start, &mut out).unwrap();
                let expected =
                    reference_attention(&shape, &keys[layer], &values[layer], &q, q_start);
                let err = max_abs_diff(&out, &expected);
                assert!(
                    err < 2e-4,
                    "layer {layer} start {q_start} n {n_q}: max error {err}"
                );
            }
        }
    }
}

#[test]
fn attention_matches_reference_across_page_boundaries() {
    // Page of 4 tokens: chunks straddle boundaries, start on them and fill pages exactly.
    check_against_reference(SHAPE, 4, &[1, 3, 1, 7, 4, 5, 1, 1, 13, 2], 1.0, 1);
    check_against_reference(SHAPE, 1, &[1, 2, 5], 1.0, 2);
    check_against_reference(SHAPE, 5, &[23, 1, 1, 9], 3.0, 3);
}

#[test]
fn attention_matches_reference_without_gqa_and_with_mqa() {
    for (n_heads, n_kv_heads) in [(4, 4), (4, 1)] {
        let shape = KvShape {
            n_layers: 1,
            n_heads,
            n_kv_heads,
            head_dim: 8,
        };
        check_against_reference(shape, 3, &[2, 5, 1, 8], 1.0, 4);
    }
}

#[test]
fn attention_matches_reference_on_the_parallel_path() {
    // SmolLM2-like heads, deep enough that decode splits the pages across threads and a prefill
    // batch splits its queries.
    let shape = KvShape {
        n_layers: 1,
        n_heads: 9,
        n_kv_heads: 3,
        head_dim: 64,
    };
    check_against_reference(shape, 32, &[700, 1, 64], 1.0, 5);
}

#[test]
fn odd_head_dim_and_page_size() {
    let shape = KvShape {
        n_layers: 1,
        n_heads: 2,
        n_kv_heads: 1,
        head_dim: 5,
    };
    check_against_reference(shape, 7, &[3, 11, 1, 20], 1.0, 6);
}

fn attend_all(cache: &KvCache, q: &[f32], start: usize) -> Vec<Vec<f32>> {
    (0..SHAPE.n_layers)
        .map(|layer| {
            let mut out = vec![0.0; q.len()];
            cache.attend(layer, q, start, &mut out).unwrap();
            out
        })
        .collect()
}

#[test]
fn truncate_then_reappend_equals_fresh() {
    let mut rng = Rng::new(7);
    let width = SHAPE.kv_width();
    let total = 50;
    let k: Vec<Vec<f32>> = (0..SHAPE.n_layers)
        .map(|_| rng.normals(total * width, 1.0))
        .collect();
    let v: Vec<Vec<f32>> = (0..SHAPE.n_layers)
        .map(|_| rng.normals(total * width, 1.0))
        .collect();
    let fill = |cache: &mut KvCache, from: usize, to: usize| {
        for layer in 0..SHAPE.n_layers {
            cache
                .append(
                    layer,
                    &k[layer][from * width..to * width],
                    &v[layer][from * width..to * width],
                )
                .unwrap();
        }
    };
    let mut fresh = KvCache::new(SHAPE, config(8, 256)).unwrap();
    fill(&mut fresh, 0, total);

    for cut in [0, 1, 8, 23, 40, 49, 50] {
        let mut cache = KvCache::new(SHAPE, config(8, 256)).unwrap();
        fill(&mut cache, 0, total);
        let garbage: Vec<f32> = rng.normals(width * 5, 9.0);
        for layer in 0..SHAPE.n_layers {
            cache.append(layer, &garbage, &garbage).unwrap();
        }
        cache.truncate(cut);
        assert_eq!(cache.len(), cut);
        fill(&mut cache, cut, total);
        assert_eq!(cache.len(), total);
        let q = rng.normals(4 * SHAPE.q_width(), 1.0);
        assert_eq!(
            attend_all(&cache, &q, total - 4),
            attend_all(&fresh, &q, total - 4),
            "cut {cut}"
        );
        let (a, b) = (cache.stats(), fresh.stats());
        assert_eq!(a.layers, b.layers);
        assert_eq!(a.total, b.total);
    }
}

#[test]
fn stats_match_the_pool_allocation() {
    let mut rng = Rng::new(8);
    let page_tokens = 8;
    let mut cache = KvCache::new(SHAPE, config(page_tokens, 1024)).unwrap();
    let width = SHAPE.kv_width();
    let page_bytes = 64 + 2 * width * page_tokens * 2;
    let check = |cache: &KvCache, tokens: usize| {
        let stats = cache.stats();
        let pages_per_layer = tokens.div_ceil(page_tokens);
        assert_eq!(stats.tokens, tokens);
        assert_eq!(stats.fp16_page_bytes, page_bytes);
        assert_eq!(
            stats.total.pages_used,
            stats.pages_allocated - stats.pages_free
        );
        assert_eq!(stats.total.pages_used, pages_per_layer * SHAPE.n_layers);
        assert_eq!(
            stats.total.allocated_bytes,
            stats.total.pages_used * page_bytes
        );
        assert_eq!(stats.pool_bytes, stats.pages_allocated * page_bytes);
        let t = &stats.total;
        assert_eq!(
            t.allocated_bytes,
            t.header_bytes + t.k_payload_bytes + t.v_payload_bytes + t.norm_bytes + t.padding_bytes
        );
        assert_eq!(t.tokens, tokens * SHAPE.n_layers);
        assert_eq!(t.fp16_tokens, t.tokens);
        if tokens.is_multiple_of(page_tokens) && tokens > 0 {
            // Full pages: 16 bits per channel plus the 64-byte header per page.
            let expected = 16.0 + 64.0 * 8.0 / (page_tokens * width * 2) as f64;
            assert!(
                (t.bits_per_channel - expected).abs() < 1e-9,
                "{}",
                t.bits_per_channel
            );
        }
        stats
    };
    check(&cache, 0);
    for n in [1, 7, 8, 17] {
        for layer in 0..SHAPE.n_layers {
            cache
                .append(
                    layer,
                    &rng.normals(n * width, 1.0),
                    &rng.normals(n * width, 1.0),
                )
                .unwrap();
        }
    }
    let before = check(&cache, 33);
    assert_eq!(before.pages_free, 0);
    cache.truncate(16);
    let after = check(&cache, 16);
    assert_eq!(after.pages_allocated, before.pages_allocated);
    assert_eq!(after.pages_free, 2 * (5 - 2));
    cache.reset();
    let empty = check(&cache, 0);
    assert_eq!(empty.pages_free, empty.pages_allocated);
    // Re-filling recycles pages instead of growing the pool.
    for layer in 0..SHAPE.n_layers {
        cache
            .append(
                layer,
                &rng.normals(40 * width, 1.0),
                &rng.normals(40 * width, 1.0),
            )
            .unwrap();
    }
    let refilled = check(&cache, 40);
    assert_eq!(refilled.pages_allocated, before.pages_allocated);
}

#[test]
fn errors_are_raised_before_anything_changes() {
    let mut cache = KvCache::new(SHAPE, config(4, 10)).unwrap();
    let width = SHAPE.kv_width();
    let tok = vec![0.5f32; 6 * width];
    for layer in 0..2 {
        cache.append(layer, &tok, &tok).unwrap();
    }
    let before = cache.stats();
    let bad = [
        cache.append(2, &tok, &tok),
        cache.append(0, &tok[..width + 1], &tok[..width + 1]),
        cache.append(0, &tok[..width], &tok[..2 * width]),
        cache.append(0, &tok[..5 * width], &tok[..5 * width]),
    ];
    assert!(matches!(
        bad[0],
        Err(KvError::LayerOutOfRange {
            layer: 2,
            n_layers: 2
        })
    ));
    assert!(matches!(bad[1], Err(KvError::ShapeMismatch { .. })));
    assert!(matches!(bad[2], Err(KvError::ShapeMismatch { .. })));
    assert!(matches!(
        bad[3],
        Err(KvError::ContextFull {
            len: 6,
            adding: 5,
            max: 10
        })
    ));
    assert_eq!(cache.stats(), before);

    let qw = SHAPE.q_width();
    let q = vec![0.1f32; 2 * qw];
    let mut out = vec![0.0f32; 2 * qw];
    assert!(matches!(
        cache.attend(0, &q, 5, &mut out),
        Err(KvError::PositionOutOfRange {
            start: 5,
            end: 7,
            len: 6,
            ..
        })
    ));
    assert!(matches!(
        cache.attend(0, &q, 0, &mut out[..qw]),
        Err(KvError::ShapeMismatch { .. })
    ));
    assert!(matches!(
        cache.attend(0, &q[..qw + 3], 0, &mut out[..qw + 3]),
        Err(KvError::ShapeMismatch { .. })
    ));
    assert!(matches!(
        cache.attend(9, &q, 0, &mut out),
        Err(KvError::LayerOutOfRange { .. })
    ));
    cache.attend(0, &q, 4, &mut out).unwrap();
    cache.attend(0, &[], 6, &mut []).unwrap();
    // Identical keys: every query returns the (identical) value.
    assert!(out.iter().all(|&x| (x - 0.5).abs() < 1e-6));

    assert!(matches!(
        KvCache::new(SHAPE, config(0, 10)),
        Err(KvError::InvalidConfig(_))
    ));
    let uneven = KvShape {
        n_heads: 5,
        ..SHAPE
    };
    assert!(matches!(
        KvCache::new(uneven, config(4, 10)),
        Err(KvError::InvalidConfig(_))
    ));
    assert!(matches!(
        KvConfig::preset("nope"),
        Err(KvError::UnknownPreset(_))
    ));
}

#[test]
fn layers_may_run_ahead_within_a_forward_pass() {
    let mut cache = KvCache::new(SHAPE, config(4, 64)).unwrap();
    let row = vec![1.0f32; 3 * SHAPE.kv_width()];
    cache.append(0, &row, &row).unwrap();
    assert_eq!(cache.len(), 0);
    assert_eq!(cache.layer_len(0).unwrap(), 3);
    cache.append(1, &row, &row).unwrap();
    assert_eq!(cache.len(), 3);
}
