//! Sliding-window attention (Mistral, Gemma 3 local layers): the same streaming attention as
//! [`KvCache::attend`], each query seeing only the last `window` keys, itself included
//! (transformers' `kv_idx > q_idx - sliding_window`, llama.cpp's `p1 - p0 < n_swa`).
//!
//! The window is counted in cache indices. After [`KvCache::retire`] dropped a run of tokens,
//! a key past the gap is `retired` positions further from the query than its index says; the
//! window then reaches that much further back.

use crate::cache::KvCache;
use crate::error::KvError;

impl KvCache {
    /// Attention of n queries at cache indices `start..start + n`, query `i` over keys
    /// `max(0, i + 1 - window)..=i`. `q`, `out` as in [`KvCache::attend`]; `window` ≥ 1.
    pub fn attend_window(
        &self,
        layer: usize,
        q: &[f32],
        start: usize,
        window: usize,
        out: &mut [f32],
    ) -> Result<(), KvError> {
        if window == 0 {
            return Err(KvError::ShapeMismatch {
                what: "sliding window: at least one token",
                expected: 1,
                got: 0,
            });
        }
        self.attend_within(layer, q, start, Some(window), out)
    }
}

#[cfg(test)]
mod tests {
    use crate::config::{KvConfig, KvShape};
    use crate::KvCache;

    /// Naive f64 softmax attention of one query head over keys `lo..=hi`.
    fn naive(q: &[f32], keys: &[Vec<f32>], values: &[Vec<f32>], lo: usize, hi: usize) -> Vec<f64> {
        let d = q.len();
        let scale = 1.0 / (d as f64).sqrt();
        let scores: Vec<f64> = (lo..=hi)
            .map(|j| {
                let dot: f64 = q
                    .iter()
                    .zip(&keys[j])
                    .map(|(a, b)| *a as f64 * *b as f64)
                    .sum();
                dot * scale
            })
            .collect();
        let m = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let w: Vec<f64> = scores.iter().map(|s| (s - m).exp()).collect();
        let total: f64 = w.iter().sum();
        let mut out = vec![0.0; d];
        for (wi, j) in w.iter().zip(lo..=hi) {
            for (o, v) in out.iter_mut().zip(&values[j]) {
                *o += wi / total * *v as f64;
            }
        }
        out
    }

    #[test]
    fn each_query_sees_exactly_its_window() {
        let shape = KvShape {
            n_layers: 1,
            n_heads: 1,
            n_kv_heads: 1,
            head_dim: 8,
        };
        let config = KvConfig {
            page_tokens: 16,
            ..KvConfig::fp16()
        };
        let mut cache = KvCache::new(shape, config).unwrap();
        let n = 70;
        // Values exactly representable in f16, so the cache stores them as given.
        let value = |t: usize, i: usize| ((t * 7 + i * 3) % 17) as f32 / 8.0 - 1.0;
        let keys: Vec<Vec<f32>> = (0..n)
            .map(|t| (0..8).map(|i| value(t, i)).collect())
            .collect();
        let values: Vec<Vec<f32>> = (0..n)
            .map(|t| (0..8).map(|i| value(t + 5, i)).collect())
            .collect();
        cache.append(0, &keys.concat(), &values.concat()).unwrap();
        let queries: Vec<f32> = (0..n)
            .flat_map(|t| (0..8).map(move |i| value(t + 3, i)))
            .collect();
        for window in [1, 5, 16, 17, 40, 200] {
            let mut out = vec![0.0; n * 8];
            cache
                .attend_window(0, &queries, 0, window, &mut out)
                .unwrap();
            for t in 0..n {
                let lo = (t + 1).saturating_sub(window);
                let expected = naive(&queries[t * 8..(t + 1) * 8], &keys, &values, lo, t);
                for (got, want) in out[t * 8..(t + 1) * 8].iter().zip(&expected) {
                    assert!(
                        (*got as f64 - want).abs() < 1e-4,
                        "window {window} query {t}"
                    );
                }
            }
        }
        let mut out = vec![0.0; 8];
        assert!(cache
            .attend_window(0, &queries[..8], 0, 0, &mut out)
            .is_err());
    }
}
