//! Turbo value codec, MSE-oriented: rotate, normalise, snap to the Lloyd–Max codebooks, pack,
//! with the least-squares scale `‖v‖·⟨y, ŷ⟩/‖ŷ‖²` per token in log-u8. No QJL: an unbiased
//! inner-product estimator does not help reconstruction. After the softmax, values are
//! accumulated in the rotated domain straight from their levels and the head's sum is
//! rotated back once per step (`finish`), never per token.

use super::norm::{decode_log_u8, decode_log_u8_pages, encode_log_u8, log_u8_bytes, with_floats};
use super::paged::{ScoreRows, ValueBlock, ValueHalf, MAX_CODED_DIM, MAX_RUN_PAGES};
use super::rotated::RotatedQuantizer;
use super::turbo_key::unit_rotated;
use crate::config::KvShape;
use crate::kernels::kv_accumulate;
use crate::pack::pack;
use crate::transform::{HeadRotations, Rotation, PURPOSE_VALUE_ROTATION};

pub(crate) struct TurboValues {
    d: usize,
    page_tokens: usize,
    half_bits: u8,
    quantizer: RotatedQuantizer,
    rotations: HeadRotations,
}

impl TurboValues {
    pub(crate) fn new(shape: &KvShape, page_tokens: usize, half_bits: u8, seed: u64) -> Self {
        let d = shape.head_dim;
        let rotations = HeadRotations::new(shape, seed, PURPOSE_VALUE_ROTATION);
        TurboValues {
            d,
            page_tokens,
            half_bits,
            quantizer: RotatedQuantizer::new(d, half_bits),
            rotations,
        }
    }

    fn rotation(&self, layer: usize, head: usize) -> &Rotation {
        self.rotations.get(layer, head)
    }
}

impl ValueHalf for TurboValues {
    fn half_bits(&self) -> u8 {
        self.half_bits
    }

    fn side_bytes(&self) -> usize {
        log_u8_bytes(self.page_tokens)
    }

    fn code_bytes(&self) -> usize {
        self.page_tokens * self.quantizer.layout.bytes()
    }

    fn encode(
        &self,
        layer: usize,
        head: usize,
        rows: &[f32],
        side: &mut [u8],
        codes_out: &mut [u8],
    ) {
        let d = self.d;
        let bytes = self.quantizer.layout.bytes();
        let rotation = self.rotation(layer, head);
        let mut scales = vec![0.0f32; self.page_tokens];
        let mut y = [0.0f32; MAX_CODED_DIM];
        let mut codes = [0u8; MAX_CODED_DIM];
        let mut recon = [0.0f32; MAX_CODED_DIM];
        let (y, codes, recon) = (&mut y[..d], &mut codes[..d], &mut recon[..d]);
        for (j, scale) in scales.iter_mut().enumerate() {
            let norm = unit_rotated(&rows[j * d..(j + 1) * d], rotation, y);
            self.quantizer.quantize(y, codes, recon);
            pack(
                codes,
                &self.quantizer.layout,
                &mut codes_out[j * bytes..(j + 1) * bytes],
            );
            let along: f32 = y.iter().zip(recon.iter()).map(|(a, b)| a * b).sum();
            let energy: f32 = recon.iter().map(|v| v * v).sum();
            *scale = if energy > 0.0 {
                norm * along / energy
            } else {
                0.0
            };
        }
        encode_log_u8(&mut scales, side);
    }

    fn decode(&self, layer: usize, head: usize, block: ValueBlock<'_>, rows: &mut [f32]) {
        let (d, side, codes_in) = (self.d, block.side, block.codes);
        let bytes = self.quantizer.layout.bytes();
        let p = self.page_tokens;
        let mut scales = vec![0.0f32; p];
        decode_log_u8(side, &mut scales);
        self.quantizer
            .dequantize_packed(&codes_in[..p * bytes], &mut rows[..p * d]);
        for (j, scale) in scales.iter().enumerate() {
            let row = &mut rows[j * d..(j + 1) * d];
            for v in row.iter_mut() {
                *v *= scale;
            }
            self.rotation(layer, head).inverse(row);
        }
    }

    fn accumulate(&self, block: ValueBlock<'_>, weights: &[f32], rows: ScoreRows, acc: &mut [f32]) {
        self.accumulate_run(&[block], self.page_tokens, weights, rows, acc);
    }

    /// The run's token scales are decoded into one buffer and its codes accumulated in one
    /// kernel call over the pages' code blocks.
    fn accumulate_run(
        &self,
        blocks: &[ValueBlock<'_>],
        page_tokens: usize,
        weights: &[f32],
        rows: ScoreRows,
        acc: &mut [f32],
    ) {
        let (n_qh, visible, stride) = (rows.n_qh, rows.visible, rows.stride);
        let p = page_tokens;
        let n_pages = visible.div_ceil(p);
        assert!(
            n_pages <= MAX_RUN_PAGES,
            "turbo values: run longer than MAX_RUN_PAGES"
        );
        let (layout, levels) = (self.quantizer.code_layout(), self.quantizer.levels());
        let mut codes: [&[u8]; MAX_RUN_PAGES] = [&[]; MAX_RUN_PAGES];
        with_floats(visible, |scales| {
            decode_log_u8_pages(blocks.iter().map(|b| b.side), p, scales);
            for (block, slot) in blocks.iter().zip(&mut codes).take(n_pages) {
                *slot = block.codes;
            }
            kv_accumulate::accumulate_code_pages(
                &codes[..n_pages],
                p,
                layout,
                levels,
                scales,
                weights,
                stride,
                &mut acc[..n_qh * self.d],
            );
        });
    }

    fn finish(&self, layer: usize, head: usize, acc_row: &mut [f32]) {
        self.rotation(layer, head).inverse(acc_row);
    }
}
