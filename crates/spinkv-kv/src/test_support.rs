//! Helpers shared by the crate's unit tests.

use crate::config::KvShape;
use crate::rng::SplitMix64;

pub(crate) fn normals(rng: &mut SplitMix64, n: usize, scale: f64) -> Vec<f32> {
    (0..n).map(|_| (rng.normal() * scale) as f32).collect()
}

/// Naive causal GQA attention in f64 over `[len][n_kv_heads][d]` keys and values.
pub(crate) fn reference_attention(
    shape: &KvShape,
    keys: &[f32],
    values: &[f32],
    q: &[f32],
    start: usize,
) -> Vec<f32> {
    let d = shape.head_dim;
    let group = shape.group_size();
    let n = q.len() / shape.q_width();
    let mut out = vec![0.0f32; q.len()];
    for i in 0..n {
        let pos = start + i;
        for h in 0..shape.n_heads {
            let g = h / group;
            let qv = &q[(i * shape.n_heads + h) * d..][..d];
            let scores: Vec<f64> = (0..=pos)
                .map(|t| {
                    let k = &keys[(t * shape.n_kv_heads + g) * d..][..d];
                    qv.iter()
                        .zip(k)
                        .map(|(a, b)| *a as f64 * *b as f64)
                        .sum::<f64>()
                        / (d as f64).sqrt()
                })
                .collect();
            let m = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let w: Vec<f64> = scores.iter().map(|s| (s - m).exp()).collect();
            let z: f64 = w.iter().sum();
            for c in 0..d {
                let acc: f64 = (0..=pos)
                    .map(|t| w[t] * values[(t * shape.n_kv_heads + g) * d + c] as f64)
                    .sum();
                out[(i * shape.n_heads + h) * d + c] = (acc / z) as f32;
            }
        }
    }
    out
}
