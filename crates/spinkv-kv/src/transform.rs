//! The structured rotation applied to keys (after RoPE), queries and values of one
//! (layer, KV head): seeded Rademacher signs followed by an orthonormal fast Walsh–Hadamard
//! transform, `y = H·D·x / sqrt(p)`.
//!
//! Head dims that are not a power of two: zero-padding to the next power of two would leave
//! `p > d` non-zero rotated coordinates, all of which must then be stored to invert the
//! transform (80 → 128 would cost 60% more bits). Instead two overlapping power-of-two blocks
//! of size `p = 2^floor(log2 d)` cover the vector: signs + FWHT on `[0, p)`, then fresh signs +
//! FWHT on `[d - p, d)`. Each step is orthonormal, so the whole is an orthonormal map of `R^d`
//! onto itself: exactly `d` coordinates are stored and no padding ever is. For power-of-two
//! dims this is the single-block transform.

use crate::config::KvShape;
use crate::kernels::fwht;
use crate::rng::SplitMix64;

/// Seed purpose tags (part of the cache identity).
pub(crate) const PURPOSE_KEY_ROTATION: u64 = 1;
pub(crate) const PURPOSE_VALUE_ROTATION: u64 = 2;

/// One [`Rotation`] per (layer, KV head), each from its own stream of the seed.
#[derive(Clone, Debug)]
pub(crate) struct HeadRotations {
    /// `[layer · n_kv_heads + head]`.
    rotations: Vec<Rotation>,
    n_kv_heads: usize,
}

impl HeadRotations {
    pub(crate) fn new(shape: &KvShape, seed: u64, purpose: u64) -> Self {
        let (d, n_kv_heads) = (shape.head_dim, shape.n_kv_heads);
        let rotations = (0..shape.n_layers * n_kv_heads)
            .map(|i| Rotation::new(d, seed, purpose, i / n_kv_heads, i % n_kv_heads))
            .collect();
        HeadRotations {
            rotations,
            n_kv_heads,
        }
    }

    pub(crate) fn get(&self, layer: usize, head: usize) -> &Rotation {
        &self.rotations[layer * self.n_kv_heads + head]
    }
}

#[derive(Clone, Debug)]
pub(crate) struct Rotation {
    d: usize,
    /// Block size (largest power of two ≤ d).
    p: usize,
    /// Signs of the first block, and of the second block when `p < d`.
    signs_a: Vec<f32>,
    signs_b: Vec<f32>,
}

impl Rotation {
    pub(crate) fn new(d: usize, seed: u64, purpose: u64, layer: usize, head: usize) -> Self {
        assert!(d > 0);
        let p = 1usize << (usize::BITS - 1 - d.leading_zeros());
        let mut rng = SplitMix64::derive(seed, purpose, layer, head);
        let signs_a = (0..p).map(|_| rng.sign()).collect();
        let signs_b = if p < d {
            (0..p).map(|_| rng.sign()).collect()
        } else {
            Vec::new()
        };
        Rotation {
            d,
            p,
            signs_a,
            signs_b,
        }
    }

    /// `x ← T·x` in place.
    pub(crate) fn forward(&self, x: &mut [f32]) {
        debug_assert_eq!(x.len(), self.d);
        signed_fwht(&mut x[..self.p], &self.signs_a);
        if self.p < self.d {
            let from = self.d - self.p;
            signed_fwht(&mut x[from..], &self.signs_b);
        }
    }

    /// `x ← Tᵀ·x` in place (the inverse).
    pub(crate) fn inverse(&self, x: &mut [f32]) {
        debug_assert_eq!(x.len(), self.d);
        if self.p < self.d {
            let from = self.d - self.p;
            fwht_signed(&mut x[from..], &self.signs_b);
        }
        fwht_signed(&mut x[..self.p], &self.signs_a);
    }
}

/// `x ← H·D·x / sqrt(n)` (spinkv-kernels' `fwht`, bit-identical on every ISA).
#[inline]
fn signed_fwht(x: &mut [f32], signs: &[f32]) {
    fwht::signed_fwht(x, signs);
}

/// `x ← D·H·x / sqrt(n)` (the inverse of [`signed_fwht`]: H/sqrt(n) and D are involutions).
#[inline]
fn fwht_signed(x: &mut [f32], signs: &[f32]) {
    fwht::fwht_signed(x, signs);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn random_vec(rng: &mut SplitMix64, d: usize) -> Vec<f32> {
        (0..d).map(|_| rng.normal() as f32).collect()
    }

    fn dot(a: &[f32], b: &[f32]) -> f64 {
        a.iter().zip(b).map(|(x, y)| *x as f64 * *y as f64).sum()
    }

    #[test]
    fn rotation_is_orthonormal_and_invertible() {
        let mut rng = SplitMix64::new(11);
        for d in [1, 2, 3, 5, 8, 16, 48, 64, 80, 96, 127, 128, 256] {
            let rot = Rotation::new(d, 42, PURPOSE_KEY_ROTATION, 3, 1);
            for _ in 0..8 {
                let (q, k) = (random_vec(&mut rng, d), random_vec(&mut rng, d));
                let (mut tq, mut tk) = (q.clone(), k.clone());
                rot.forward(&mut tq);
                rot.forward(&mut tk);
                let norm = dot(&k, &k).sqrt();
                assert!((dot(&tk, &tk).sqrt() - norm).abs() <= 1e-5 * norm, "d={d}");
                assert!(
                    (dot(&tq, &tk) - dot(&q, &k)).abs() <= 1e-5 * (1.0 + norm * dot(&q, &q).sqrt()),
                    "d={d}"
                );
                rot.inverse(&mut tk);
                for (a, b) in tk.iter().zip(&k) {
                    assert!((a - b).abs() < 1e-5, "d={d}");
                }
            }
        }
    }

    #[test]
    fn rotations_differ_by_layer_and_head_and_are_reproducible() {
        let a = Rotation::new(64, 1, PURPOSE_KEY_ROTATION, 0, 0);
        let b = Rotation::new(64, 1, PURPOSE_KEY_ROTATION, 0, 1);
        let c = Rotation::new(64, 1, PURPOSE_KEY_ROTATION, 1, 0);
        let a2 = Rotation::new(64, 1, PURPOSE_KEY_ROTATION, 0, 0);
        assert_ne!(a.signs_a, b.signs_a);
        assert_ne!(a.signs_a, c.signs_a);
        assert_eq!(a.signs_a, a2.signs_a);
    }

    #[test]
    fn fwht_spreads_a_spike_evenly() {
        let mut x = vec![0.0f32; 16];
        x[3] = 1.0;
        signed_fwht(&mut x, &[1.0; 16]);
        assert!(x.iter().all(|v| (v.abs() - 0.25).abs() < 1e-7));
    }
}
