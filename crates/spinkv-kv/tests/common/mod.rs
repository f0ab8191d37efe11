//! Shared helpers of the integration tests: a seeded generator and a naive attention reference.
#![allow(dead_code)]

use half::f16;
use spinkv_kv::KvShape;

/// SplitMix64: tiny, seeded, good enough for test data.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    pub fn uniform(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Standard normal (Box–Muller).
    pub fn normal(&mut self) -> f64 {
        let u1 = self.uniform().max(1e-300);
        let u2 = self.uniform();
        (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
    }

    pub fn normals(&mut self, n: usize, scale: f64) -> Vec<f32> {
        (0..n).map(|_| (self.normal() * scale) as f32).collect()
    }
}

/// Rounds through f16, as the fp16 cache stores values.
pub fn round_f16(x: &[f32]) -> Vec<f32> {
    x.iter().map(|&v| f16::from_f32(v).to_f32()).collect()
}

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

pub fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}
