//! The scalar quantiser shared by the Turbo key and value codecs: each coordinate of a rotated
//! unit vector snapped to its channel's Lloyd–Max codebook, channels split between two widths
//! for fractional rates (see `pack::BitLayout`).

use std::sync::Arc;

use crate::codebook::{codebook, Codebook};
use crate::kernels::{codes, quantize, CodeLayout, Levels};
use crate::pack::BitLayout;

pub(crate) struct RotatedQuantizer {
    pub(crate) layout: BitLayout,
    hi: Arc<Codebook>,
    lo: Arc<Codebook>,
}

impl RotatedQuantizer {
    pub(crate) fn new(d: usize, half_bits: u8) -> Self {
        let layout = BitLayout::for_half_bits(d, half_bits);
        RotatedQuantizer {
            hi: codebook(d, layout.hi),
            lo: codebook(d, layout.lo),
            layout,
        }
    }

    /// Reconstruction levels of the hi and lo channel groups (what codes stand for).
    #[inline]
    pub(crate) fn levels(&self) -> Levels<'_> {
        Levels {
            hi: &self.hi.levels,
            lo: &self.lo.levels,
        }
    }

    /// Codes of the rotated unit vector `y`, and the levels they stand for in `recon`.
    pub(crate) fn quantize(&self, y: &[f32], codes: &mut [u8], recon: &mut [f32]) {
        let thresholds = Levels {
            hi: &self.hi.thresholds,
            lo: &self.lo.thresholds,
        };
        quantize::quantize(y, &self.layout, thresholds, self.levels(), codes, recon);
    }

    /// Levels of the packed vectors in `bytes` (`rows` of them, `[rows][d]` out).
    #[inline]
    pub(crate) fn dequantize_packed(&self, bytes: &[u8], out: &mut [f32]) {
        codes::dequantize(bytes, &self.layout, self.levels(), out);
    }

    pub(crate) fn code_layout(&self) -> &CodeLayout {
        &self.layout
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::paged::{ValueBlock, ValueHalf};
    use crate::codec::turbo_value::TurboValues;
    use crate::rng::SplitMix64;
    use crate::transform::{Rotation, PURPOSE_VALUE_ROTATION};

    fn random_unit(rng: &mut SplitMix64, d: usize) -> Vec<f32> {
        let x: Vec<f32> = (0..d).map(|_| rng.normal() as f32).collect();
        let n = x.iter().map(|v| v * v).sum::<f32>().sqrt();
        x.iter().map(|v| v / n).collect()
    }

    /// The vectorised quantiser picks each channel's nearest level, as the codebook says.
    #[test]
    fn quantize_matches_the_codebooks() {
        let mut rng = SplitMix64::new(3);
        for (d, half_bits) in [(64usize, 7u8), (64, 6), (128, 8), (80, 5), (33, 7)] {
            let quantizer = RotatedQuantizer::new(d, half_bits);
            let (mut codes, mut recon) = (vec![0u8; d], vec![0.0f32; d]);
            for _ in 0..50 {
                let y = random_unit(&mut rng, d);
                quantizer.quantize(&y, &mut codes, &mut recon);
                for c in 0..d {
                    let book = if c < quantizer.layout.n_hi {
                        &quantizer.hi
                    } else {
                        &quantizer.lo
                    };
                    assert_eq!(codes[c], book.quantize(y[c]), "d={d} c={c}");
                    assert_eq!(recon[c], book.levels[codes[c] as usize]);
                }
            }
        }
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
            let shape = crate::config::KvShape {
                n_layers: 1,
                n_heads: 1,
                n_kv_heads: 1,
                head_dim: d,
            };
            let codec = TurboValues::new(&shape, p, half_bits, 99);
            let mut rng = SplitMix64::new(half_bits as u64);
            let rows: Vec<f32> = (0..p)
                .flat_map(|_| random_unit(&mut rng, d).into_iter().map(|v| v * 3.0))
                .collect();
            let mut side = vec![0u8; codec.side_bytes()];
            let mut codes = vec![0u8; codec.code_bytes()];
            codec.encode(0, 0, &rows, &mut side, &mut codes);
            let mut back = vec![0.0f32; p * d];
            let block = ValueBlock {
                side: &side,
                codes: &codes,
            };
            codec.decode(0, 0, block, &mut back);
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
