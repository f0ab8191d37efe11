//! The scalar quantiser shared by the Turbo key and value codecs: each coordinate of a rotated
//! unit vector snapped to its channel's Lloyd–Max codebook, channels split between two widths
//! for fractional rates (see `pack::BitLayout`).

use std::sync::Arc;

use crate::codebook::{codebook, Codebook};
use crate::pack::BitLayout;

pub(crate) struct RotatedQuantizer {
    pub(crate) layout: BitLayout,
    hi: Arc<Codebook>,
    lo: Arc<Codebook>,
    /// Start of channel c's entries in a per-query lookup table.
    lut_offsets: Vec<u32>,
    lut_len: usize,
}

impl RotatedQuantizer {
    pub(crate) fn new(d: usize, half_bits: u8) -> Self {
        let layout = BitLayout::for_half_bits(d, half_bits);
        let mut lut_offsets = Vec::with_capacity(d);
        let mut at = 0u32;
        for c in 0..d {
            lut_offsets.push(at);
            at += 1 << layout.width(c);
        }
        RotatedQuantizer {
            hi: codebook(d, layout.hi),
            lo: codebook(d, layout.lo),
            layout,
            lut_offsets,
            lut_len: at as usize,
        }
    }

    #[inline]
    fn book(&self, channel: usize) -> &Codebook {
        if channel < self.layout.n_hi {
            &self.hi
        } else {
            &self.lo
        }
    }

    /// Codes of the rotated unit vector `y`, and the levels they stand for in `recon`.
    pub(crate) fn quantize(&self, y: &[f32], codes: &mut [u8], recon: &mut [f32]) {
        for (c, ((&yc, code), r)) in y
            .iter()
            .zip(codes.iter_mut())
            .zip(recon.iter_mut())
            .enumerate()
        {
            let book = self.book(c);
            *code = book.quantize(yc);
            *r = book.levels[*code as usize];
        }
    }

    /// Levels of `codes`.
    #[inline]
    pub(crate) fn dequantize(&self, codes: &[u8], recon: &mut [f32]) {
        let n_hi = self.layout.n_hi;
        for (r, &code) in recon[..n_hi].iter_mut().zip(&codes[..n_hi]) {
            *r = self.hi.levels[code as usize];
        }
        for (r, &code) in recon[n_hi..].iter_mut().zip(&codes[n_hi..]) {
            *r = self.lo.levels[code as usize];
        }
    }

    pub(crate) fn lut_len(&self) -> usize {
        self.lut_len
    }

    /// `lut[offset(c) + v] = q[c] · level_c(v)`: scoring a code vector becomes d lookups.
    pub(crate) fn build_lut(&self, q_rot: &[f32], lut: &mut [f32]) {
        for (c, &qc) in q_rot.iter().enumerate() {
            let book = self.book(c);
            let at = self.lut_offsets[c] as usize;
            for (entry, level) in lut[at..at + book.levels.len()].iter_mut().zip(&book.levels) {
                *entry = qc * level;
            }
        }
    }

    /// `Σ_c lut[offset(c) + codes[c]]`.
    #[inline]
    pub(crate) fn lut_score(&self, lut: &[f32], codes: &[u8]) -> f32 {
        let mut acc = [0.0f32; 4];
        let mut chunks = self.lut_offsets.chunks_exact(4).zip(codes.chunks_exact(4));
        for (offs, cs) in &mut chunks {
            for lane in 0..4 {
                acc[lane] += lut[offs[lane] as usize + cs[lane] as usize];
            }
        }
        let done = self.lut_offsets.len() / 4 * 4;
        let mut sum = (acc[0] + acc[1]) + (acc[2] + acc[3]);
        for c in done..self.lut_offsets.len() {
            sum += lut[self.lut_offsets[c] as usize + codes[c] as usize];
        }
        sum
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::paged::ValueHalf;
    use crate::codec::turbo_value::TurboValues;
    use crate::rng::SplitMix64;
    use crate::transform::{Rotation, PURPOSE_VALUE_ROTATION};

    fn random_unit(rng: &mut SplitMix64, d: usize) -> Vec<f32> {
        let x: Vec<f32> = (0..d).map(|_| rng.normal() as f32).collect();
        let n = x.iter().map(|v| v * v).sum::<f32>().sqrt();
        x.iter().map(|v| v / n).collect()
    }

    /// Rotate, snap, rotate back: mean ‖x - x̂‖² of random unit vectors against the TurboQuant
    /// paper's D_mse ≈ 0.36, 0.117, 0.03, 0.009 and the 4^-b lower bound.
    ///
    /// The paper's 3-bit figure is a rounding: the Lloyd–Max optimum for this law is 0.0345 in
    /// the Gaussian limit (0.0334 at d = 64), and no scalar quantiser does better, so 3 bits is
    /// held to the computed codebook's own expected error instead.
    #[test]
    fn codec_mse_on_random_unit_vectors_matches_the_paper() {
        let paper = [0.36, 0.117, 0.03, 0.009];
        for d in [64usize, 128] {
            let rotation = Rotation::new(d, 7, PURPOSE_VALUE_ROTATION, 0, 0);
            for bits in 1..=4u32 {
                let quantizer = RotatedQuantizer::new(d, 2 * bits as u8);
                let mut rng = SplitMix64::new(bits as u64);
                let trials = 4000;
                let mut total = 0.0f64;
                let (mut codes, mut recon) = (vec![0u8; d], vec![0.0f32; d]);
                for _ in 0..trials {
                    let x = random_unit(&mut rng, d);
                    let mut y = x.clone();
                    rotation.forward(&mut y);
                    quantizer.quantize(&y, &mut codes, &mut recon);
                    rotation.inverse(&mut recon);
                    total += x
                        .iter()
                        .zip(&recon)
                        .map(|(a, b)| ((a - b) as f64).powi(2))
                        .sum::<f64>();
                }
                let mse = total / trials as f64;
                let target = if bits == 3 {
                    quantizer.hi.unit_mse
                } else {
                    paper[bits as usize - 1]
                };
                eprintln!(
                    "d={d} bits={bits}: mse {mse:.5} (paper {}, codebook {:.5})",
                    paper[bits as usize - 1],
                    quantizer.hi.unit_mse
                );
                assert!(
                    (mse / target - 1.0).abs() < 0.05,
                    "d={d} bits={bits}: {mse} vs {target}"
                );
                assert!(mse > 4f64.powi(-(bits as i32)));
            }
        }
    }

    /// The value codec end to end (least-squares scale in log-u8) is no worse than the bare
    /// quantiser with exact norms, at every rate including the fractional ones.
    #[test]
    fn value_codec_round_trip_error() {
        let (d, p) = (64, 32);
        for half_bits in 4..=8u8 {
            let codec = TurboValues::new(1, 1, d, p, half_bits, 99);
            let mut rng = SplitMix64::new(half_bits as u64);
            let rows: Vec<f32> = (0..p)
                .flat_map(|_| random_unit(&mut rng, d).into_iter().map(|v| v * 3.0))
                .collect();
            let mut side = vec![0u8; codec.side_bytes()];
            let mut codes = vec![0u8; codec.code_bytes()];
            codec.encode(0, 0, &rows, &mut side, &mut codes);
            let mut back = vec![0.0f32; p * d];
            codec.decode(0, 0, &side, &codes, &mut back);
            let mse = rows
                .iter()
                .zip(&back)
                .map(|(a, b)| ((a - b) / 3.0).powi(2) as f64)
                .sum::<f64>()
                / p as f64;
            let layout = BitLayout::for_half_bits(d, half_bits);
            let expected = (layout.n_hi as f64 * codebook(d, layout.hi).unit_mse
                + (d - layout.n_hi) as f64 * codebook(d, layout.lo).unit_mse)
                / d as f64;
            eprintln!(
                "value codec {} bits: mse {mse:.5}, quantiser {expected:.5}",
                half_bits as f32 / 2.0
            );
            assert!(mse < expected * 1.25, "{mse} vs {expected}");
        }
    }
}
