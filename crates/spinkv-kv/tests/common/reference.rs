//! The naive attention both the unit tests (`src/test_support.rs`) and the integration tests
//! (`tests/common`) check the cache against; each includes this file and brings `KvShape`
//! into scope first.

use super::KvShape;

/// Naive causal GQA attention in f64. `keys`, `values`: `[len][n_kv_heads][d]` (all tokens of
/// the layer); `q`: `[n][n_heads][d]` at positions `start..start+n`.
pub fn reference_attention(
    shape: &KvShape,
    keys: &[f32],
    values: &[f32],
    q: &[f32],
    start: usize,
) -> Vec<f32> {
    let d = shape.head_dim;
    let group = shape.n_heads / shape.n_kv_heads;
    let n = q.len() / (shape.n_heads * d);
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
