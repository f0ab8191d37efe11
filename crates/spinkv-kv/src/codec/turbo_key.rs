//! Turbo key codec: rotate (signs + FWHT, per layer and KV head), normalise, snap every
//! coordinate to its Lloyd–Max codebook, pack; one scale per token (log-u8 or f16). Keys are
//! scored straight from the codes: the query is rotated once per head and step, and a token's
//! score is its scale times `Σ_c q_c · level_c(code_c)`. Where the code widths allow (up to 4
//! bits, head dim up to 256: every preset) that sum runs in integers — the rotated query
//! quantised once per step to int16, the levels once per codec to int8, codes looked up in a
//! 16-entry byte table (spinkv-kernels' `kv_score::int_dot`); otherwise the codes are decoded
//! to float levels and dotted with the query (`kv_score::score_codes`). Either way each key
//! row is decoded once for all query heads of its KV head.
//!
//! The stored scale is `‖k‖ / ⟨y, ŷ⟩` (y the rotated unit key, ŷ its codebook levels), which
//! makes `⟨q, k̂⟩` unbiased along the key's own direction (the RaBitQ estimator) rather than
//! shrunk by the quantiser's `1 - D`. With the QJL residual the scale is instead the
//! least-squares `‖k‖·⟨y, ŷ⟩ / ‖ŷ‖²` (smallest residual) and the residual sketch corrects the score.

use super::norm::{
    decode_f16, decode_log_u8, decode_log_u8_pages, encode_f16, encode_log_u8, log_u8_bytes,
    with_floats,
};
use super::paged::{
    for_each_page, KeyBlock, KeyBlockMut, KeyHalf, ScoreRows, MAX_CODED_DIM, MAX_RUN_PAGES,
};
use super::qjl::Qjl;
use super::rotated::RotatedQuantizer;
use crate::config::{KvShape, NormFormat};
use crate::kernels::kv_score::int_dot::{self, IntLevels, IntQueries, IntRows};
use crate::kernels::{codes, kv_score, Levels};
use crate::pack::pack;
use crate::transform::{HeadRotations, Rotation, PURPOSE_KEY_ROTATION};

pub(crate) struct TurboKeys {
    d: usize,
    page_tokens: usize,
    half_bits: u8,
    quantizer: RotatedQuantizer,
    norm: NormFormat,
    rotations: HeadRotations,
    qjl: Option<Qjl>,
    /// The integer scan's level tables, when the layout has one.
    int_levels: Option<IntLevels>,
    /// What codes stand for (hi, lo tables): the integer tables' values when the integer
    /// scan runs — so the scale, the QJL residual and decoding see the keys the scan scores —
    /// else the codebooks' levels.
    key_levels: [Vec<f32>; 2],
}

impl TurboKeys {
    /// `half_bits`: the total key rate; with QJL one bit per channel of it goes to the sketch.
    pub(crate) fn new(
        shape: &KvShape,
        page_tokens: usize,
        half_bits: u8,
        norm: NormFormat,
        with_qjl: bool,
        seed: u64,
    ) -> Self {
        let d = shape.head_dim;
        let mse_half_bits = if with_qjl { half_bits - 2 } else { half_bits };
        let rotations = HeadRotations::new(shape, seed, PURPOSE_KEY_ROTATION);
        let quantizer = RotatedQuantizer::new(d, mse_half_bits);
        let int_levels = IntLevels::new(quantizer.code_layout(), quantizer.levels());
        let key_levels = match &int_levels {
            Some(int) => [&int.hi, &int.lo].map(|t| t.map(|v| int.scale * v as f32).to_vec()),
            None => {
                let levels = quantizer.levels();
                [levels.hi.to_vec(), levels.lo.to_vec()]
            }
        };
        TurboKeys {
            d,
            page_tokens,
            half_bits,
            quantizer,
            norm,
            rotations,
            qjl: with_qjl.then(|| Qjl::new(d, seed)),
            int_levels,
            key_levels,
        }
    }

    fn rotation(&self, layer: usize, head: usize) -> &Rotation {
        self.rotations.get(layer, head)
    }

    /// Floats of a head's prepared state before the integer query: the rotated query, then
    /// the QJL tables.
    fn float_len(&self) -> usize {
        self.d + self.qjl.as_ref().map_or(0, |q| q.prepared_len())
    }

    /// Floats holding the integer query: its factor, then its int16s two per float.
    fn int_len(&self) -> usize {
        self.int_levels.map_or(0, |_| {
            1 + int_dot::query_len(self.quantizer.code_layout()) / 2
        })
    }

    fn key_levels(&self) -> Levels<'_> {
        Levels {
            hi: &self.key_levels[0],
            lo: &self.key_levels[1],
        }
    }

    /// The key levels of the packed rows in `bytes` (`[rows][d]` out).
    fn dequantize(&self, bytes: &[u8], out: &mut [f32]) {
        codes::dequantize(bytes, self.quantizer.code_layout(), self.key_levels(), out);
    }

    fn token_code_bytes(&self) -> usize {
        self.quantizer.layout.bytes()
    }

    /// The first `scales.len()` token scales of a page block.
    fn decode_scales(&self, side: &[u8], scales: &mut [f32]) {
        match self.norm {
            NormFormat::LogU8 => decode_log_u8(side, scales),
            NormFormat::F16 => decode_f16(side, scales),
        }
    }
}

impl KeyHalf for TurboKeys {
    fn half_bits(&self) -> u8 {
        self.half_bits
    }

    fn side_bytes(&self) -> usize {
        match self.norm {
            NormFormat::LogU8 => log_u8_bytes(self.page_tokens),
            NormFormat::F16 => 2 * self.page_tokens,
        }
    }

    fn code_bytes(&self) -> usize {
        self.page_tokens * self.token_code_bytes()
    }

    fn residual_bytes(&self) -> usize {
        self.qjl
            .as_ref()
            .map_or(0, |q| self.page_tokens * q.token_bytes())
    }

    fn encode(&self, layer: usize, head: usize, rows: &[f32], block: KeyBlockMut<'_>) {
        let (d, p) = (self.d, self.page_tokens);
        let rotation = self.rotation(layer, head);
        let bytes = self.token_code_bytes();
        // Rotated unit keys and their norms are kept for the residual pass.
        let mut rotated = vec![0.0f32; p * d];
        let mut norms = vec![0.0f32; p];
        let mut scales = vec![0.0f32; p];
        let mut codes = [0u8; MAX_CODED_DIM];
        let mut recon = [0.0f32; MAX_CODED_DIM];
        let (codes, recon) = (&mut codes[..d], &mut recon[..d]);
        for j in 0..p {
            let y = &mut rotated[j * d..(j + 1) * d];
            let norm = unit_rotated(&rows[j * d..(j + 1) * d], rotation, y);
            self.quantizer.quantize(y, codes, recon);
            if self.int_levels.is_some() {
                let (layout, levels) = (self.quantizer.code_layout(), self.key_levels());
                for (c, (r, &code)) in recon.iter_mut().zip(codes.iter()).enumerate() {
                    let table = if c < layout.n_hi {
                        levels.hi
                    } else {
                        levels.lo
                    };
                    *r = table[code as usize];
                }
            }
            pack(
                codes,
                &self.quantizer.layout,
                &mut block.codes[j * bytes..(j + 1) * bytes],
            );
            let along: f32 = y.iter().zip(recon.iter()).map(|(a, b)| a * b).sum();
            let energy: f32 = recon.iter().map(|v| v * v).sum();
            norms[j] = norm;
            scales[j] = match (&self.qjl, along > 0.0) {
                (_, false) => 0.0,
                (None, true) => norm / along,
                (Some(_), true) => norm * along / energy,
            };
        }
        match self.norm {
            NormFormat::LogU8 => encode_log_u8(&mut scales, block.side),
            NormFormat::F16 => encode_f16(&mut scales, block.side),
        }
        if let Some(qjl) = &self.qjl {
            let sketch_bytes = qjl.token_bytes();
            let mut residual = [0.0f32; MAX_CODED_DIM];
            let residual = &mut residual[..d];
            for j in 0..p {
                let y = &rotated[j * d..(j + 1) * d];
                self.dequantize(&block.codes[j * bytes..(j + 1) * bytes], recon);
                for c in 0..d {
                    residual[c] = norms[j] * y[c] - scales[j] * recon[c];
                }
                qjl.encode(
                    residual,
                    &mut block.residual[j * sketch_bytes..(j + 1) * sketch_bytes],
                );
            }
        }
    }

    fn decode(&self, layer: usize, head: usize, block: KeyBlock<'_>, rows: &mut [f32]) {
        let (d, p) = (self.d, self.page_tokens);
        let bytes = self.token_code_bytes();
        let mut scales = vec![0.0f32; p];
        self.decode_scales(block.side, &mut scales);
        let mut extra = [0.0f32; MAX_CODED_DIM];
        let extra = &mut extra[..d];
        self.dequantize(&block.codes[..p * bytes], &mut rows[..p * d]);
        for j in 0..p {
            let row = &mut rows[j * d..(j + 1) * d];
            for v in row.iter_mut() {
                *v *= scales[j];
            }
            if let Some(qjl) = &self.qjl {
                let tb = qjl.token_bytes();
                qjl.decode(&block.residual[j * tb..(j + 1) * tb], extra);
                for (v, e) in row.iter_mut().zip(extra.iter()) {
                    *v += e;
                }
            }
            self.rotation(layer, head).inverse(row);
        }
    }

    /// The rotated query, the QJL tables, then the integer query.
    fn prepared_len(&self) -> usize {
        self.float_len() + self.int_len()
    }

    fn prepare(&self, layer: usize, head: usize, query: &[f32], prepared: &mut [f32]) {
        let (floats, int_part) = prepared.split_at_mut(self.float_len());
        let (rotated, tables) = floats.split_at_mut(self.d);
        rotated.copy_from_slice(query);
        self.rotation(layer, head).forward(rotated);
        if let Some(qjl) = &self.qjl {
            qjl.prepare(rotated, tables);
        }
        if let Some(levels) = &self.int_levels {
            let (factor, values) = int_part.split_at_mut(1);
            let values: &mut [i16] = bytemuck::cast_slice_mut(values);
            factor[0] =
                int_dot::quantize_query(self.quantizer.code_layout(), levels, rotated, values);
        }
    }

    fn score(&self, block: KeyBlock<'_>, prepared: &[f32], rows: ScoreRows, scores: &mut [f32]) {
        self.score_run(&[block], self.page_tokens, prepared, rows, scores);
    }

    /// The run's token scales are decoded into one buffer and its codes scored in one kernel
    /// call (the integer scan takes the pages' code blocks as a list); only the float fallback
    /// (widths above 4 bits) goes page by page.
    fn score_run(
        &self,
        blocks: &[KeyBlock<'_>],
        page_tokens: usize,
        prepared: &[f32],
        rows: ScoreRows,
        scores: &mut [f32],
    ) {
        let (n_qh, visible, stride) = (rows.n_qh, rows.visible, rows.stride);
        let d = self.d;
        let p = page_tokens;
        let bytes = self.token_code_bytes();
        let per = self.prepared_len();
        let n_pages = visible.div_ceil(p);
        assert!(
            n_pages <= MAX_RUN_PAGES,
            "turbo keys: run longer than MAX_RUN_PAGES"
        );
        let (layout, levels) = (self.quantizer.code_layout(), self.key_levels());
        with_floats(visible, |scales| {
            match self.norm {
                NormFormat::LogU8 => decode_log_u8_pages(blocks.iter().map(|b| b.side), p, scales),
                NormFormat::F16 => {
                    for (i, block) in blocks.iter().enumerate().take(n_pages) {
                        let first = i * p;
                        decode_f16(block.side, &mut scales[first..visible.min(first + p)]);
                    }
                }
            }
            if let Some(int_levels) = &self.int_levels {
                let mut codes: [&[u8]; MAX_RUN_PAGES] = [&[]; MAX_RUN_PAGES];
                for (slot, block) in codes.iter_mut().zip(&blocks[..n_pages]) {
                    *slot = block.codes;
                }
                let heads = &prepared[..n_qh * per];
                let int_at = self.float_len();
                let values: &[i16] = bytemuck::cast_slice(heads);
                let coded = IntRows {
                    pages: &codes[..n_pages],
                    page_rows: p,
                    layout,
                    levels: int_levels,
                    scales,
                };
                let queries = IntQueries {
                    n_qh,
                    values: &values[2 * (int_at + 1)..],
                    value_stride: 2 * per,
                    factors: &heads[int_at..],
                    factor_stride: per,
                };
                int_dot::score_codes_int(coded, queries, scores, stride);
            } else {
                // Prepared state starts with the rotated query, `d` floats of every head.
                let queries: Vec<f32>;
                let queries = if self.qjl.is_none() {
                    &prepared[..n_qh * d]
                } else {
                    queries = prepared
                        .chunks_exact(per)
                        .take(n_qh)
                        .flat_map(|p| p[..d].iter().copied())
                        .collect();
                    &queries[..]
                };
                for_each_page(blocks, p, rows, |block, first, page| {
                    let codes = &block.codes[..page.visible * bytes];
                    let scales = &scales[first..first + page.visible];
                    let scores = &mut scores[first..];
                    kv_score::score_codes(codes, layout, levels, scales, queries, scores, stride);
                });
            }
            if let Some(qjl) = &self.qjl {
                for_each_page(blocks, p, rows, |block, first, page| {
                    self.add_residual_scores(block, prepared, page, &mut scores[first..], qjl);
                });
            }
        });
    }
}

impl TurboKeys {
    /// Adds the QJL sketches' correction to the codes' scores.
    fn add_residual_scores(
        &self,
        block: KeyBlock<'_>,
        prepared: &[f32],
        rows: ScoreRows,
        scores: &mut [f32],
        qjl: &Qjl,
    ) {
        let (d, per, tb) = (self.d, self.prepared_len(), qjl.token_bytes());
        for j in 0..rows.visible {
            let sketch = &block.residual[j * tb..(j + 1) * tb];
            for qh in 0..rows.n_qh {
                let tables = &prepared[qh * per + d..qh * per + self.float_len()];
                scores[qh * rows.stride + j] += qjl.score(tables, sketch);
            }
        }
    }
}

/// Writes `T·(x/‖x‖)` into `y` and returns `‖x‖` (a zero vector stays zero).
pub(crate) fn unit_rotated(x: &[f32], rotation: &Rotation, y: &mut [f32]) -> f32 {
    let norm = x.iter().map(|v| v * v).sum::<f32>().sqrt();
    let inv = if norm > 0.0 { 1.0 / norm } else { 0.0 };
    for (yi, xi) in y.iter_mut().zip(x) {
        *yi = xi * inv;
    }
    rotation.forward(y);
    norm
}
