//! QJL residual sketch for keys (the experimental arm): the 1-bit signs of a seeded Gaussian
//! projection `S` (m × d, m = d rounded up to a multiple of 8) of the key's residual `r` in the
//! rotated domain, plus `‖r‖` as f16. For a query q,
//! `⟨q, r⟩ ≈ ‖r‖ · sqrt(π/2) / m · Σ_i sign((S r)_i) · (S q)_i`, an unbiased estimator
//! (E[sign(s·r)·(s·q)] = sqrt(2/π)·⟨r, q⟩/‖r‖ for a Gaussian row s).

use half::f16;

use crate::rng::SplitMix64;

pub(crate) const PURPOSE_QJL_PROJECTION: u64 = 3;

pub(crate) struct Qjl {
    d: usize,
    m: usize,
    /// `[m][d]`, N(0, 1) entries.
    projection: Vec<f32>,
}

impl Qjl {
    /// One projection per cache (the per-(layer, head) rotations already decorrelate heads).
    pub(crate) fn new(d: usize, seed: u64) -> Self {
        let m = d.div_ceil(8) * 8;
        let mut rng = SplitMix64::derive(seed, PURPOSE_QJL_PROJECTION, 0, 0);
        let projection = (0..m * d).map(|_| rng.normal() as f32).collect();
        Qjl { d, m, projection }
    }

    /// Bytes per token: m sign bits and the f16 residual norm.
    pub(crate) fn token_bytes(&self) -> usize {
        self.m / 8 + 2
    }

    /// Floats of per-query tables: one 256-entry table per sign byte.
    pub(crate) fn prepared_len(&self) -> usize {
        self.m / 8 * 256
    }

    fn project(&self, x: &[f32], out: &mut [f32]) {
        for (o, row) in out.iter_mut().zip(self.projection.chunks_exact(self.d)) {
            *o = row.iter().zip(x).map(|(a, b)| a * b).sum();
        }
    }

    /// Writes the sketch of residual `r` into `out` (`token_bytes()` long).
    pub(crate) fn encode(&self, r: &[f32], out: &mut [u8]) {
        let mut projected = [0.0f32; 1032];
        let projected = &mut projected[..self.m];
        self.project(r, projected);
        let (signs, norm) = out.split_at_mut(self.m / 8);
        for (byte, chunk) in signs.iter_mut().zip(projected.chunks_exact(8)) {
            *byte = chunk
                .iter()
                .enumerate()
                .fold(0u8, |b, (k, v)| b | (((*v >= 0.0) as u8) << k));
        }
        let rn: f32 = r.iter().map(|v| v * v).sum::<f32>().sqrt();
        norm.copy_from_slice(&f16::from_f32(rn).to_le_bytes());
    }

    /// Tables turning sign bytes into `sqrt(π/2)/m · Σ_i ±(S q)_i` by lookups.
    pub(crate) fn prepare(&self, q: &[f32], tables: &mut [f32]) {
        let mut projected = [0.0f32; 1032];
        let projected = &mut projected[..self.m];
        self.project(q, projected);
        let scale = (std::f32::consts::PI / 2.0).sqrt() / self.m as f32;
        for (table, sq) in tables.chunks_exact_mut(256).zip(projected.chunks_exact(8)) {
            table[0] = -sq.iter().sum::<f32>() * scale;
            for v in 1..256usize {
                let low = v.trailing_zeros() as usize;
                table[v] = table[v & (v - 1)] + 2.0 * sq[low] * scale;
            }
        }
    }

    /// The estimate of `⟨q, r⟩` for one token's sketch.
    #[inline]
    pub(crate) fn score(&self, tables: &[f32], sketch: &[u8]) -> f32 {
        let (signs, norm) = sketch.split_at(self.m / 8);
        let sum: f32 = signs
            .iter()
            .enumerate()
            .map(|(b, &s)| tables[b * 256 + s as usize])
            .sum();
        sum * f16::from_le_bytes([norm[0], norm[1]]).to_f32()
    }

    /// `‖r‖ · sqrt(π/2)/m · Sᵀ sign(S r)`: the residual's expected direction, for decoding.
    pub(crate) fn decode(&self, sketch: &[u8], out: &mut [f32]) {
        let (signs, norm) = sketch.split_at(self.m / 8);
        let rn = f16::from_le_bytes([norm[0], norm[1]]).to_f32();
        let scale = rn * (std::f32::consts::PI / 2.0).sqrt() / self.m as f32;
        out.fill(0.0);
        for (i, row) in self.projection.chunks_exact(self.d).enumerate() {
            let s = if signs[i / 8] >> (i % 8) & 1 == 1 {
                scale
            } else {
                -scale
            };
            for (o, a) in out.iter_mut().zip(row) {
                *o += s * a;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn estimator_is_unbiased_within_three_standard_errors() {
        let d = 64;
        let mut rng = SplitMix64::new(5);
        let r: Vec<f32> = (0..d).map(|_| rng.normal() as f32).collect();
        let q: Vec<f32> = (0..d).map(|i| r[i] * 0.6 + rng.normal() as f32).collect();
        let exact: f64 = r.iter().zip(&q).map(|(a, b)| *a as f64 * *b as f64).sum();
        // Independent projections = independent estimates.
        let trials = 2000;
        let mut estimates = Vec::with_capacity(trials);
        let mut sketch = vec![0u8; 10];
        let mut tables = vec![0.0f32; 8 * 256];
        for t in 0..trials {
            let qjl = Qjl::new(d, 1000 + t as u64);
            qjl.encode(&r, &mut sketch);
            qjl.prepare(&q, &mut tables);
            estimates.push(qjl.score(&tables, &sketch) as f64);
        }
        let mean = estimates.iter().sum::<f64>() / trials as f64;
        let var = estimates.iter().map(|e| (e - mean).powi(2)).sum::<f64>() / (trials - 1) as f64;
        let se = (var / trials as f64).sqrt();
        // f16 rounding of ‖r‖ adds a relative bias below 2^-11; allow for it.
        assert!(
            (mean - exact).abs() < 3.0 * se + exact.abs() * 1e-3,
            "mean {mean} exact {exact} se {se}"
        );
    }
}
