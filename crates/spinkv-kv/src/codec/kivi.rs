//! KIVI-like control arm: asymmetric integer codes, keys per channel over groups of
//! `group` tokens, values per token over groups of channels. Each group stores its minimum and
//! step as f16. Attention reads the codes directly: for a key group the query folds into
//! `q_c·step_c` and a constant `Σ q_c·min_c`; values accumulate `w·(min + step·code)` per token.

use half::f16;

use super::paged::{
    KeyBlock, KeyBlockMut, KeyHalf, ScoreRows, ValueBlock, ValueHalf, MAX_CODED_DIM,
};
use crate::kernels::{axpy_f32, kv_score, Levels};
use crate::pack::{pack, unpack, BitLayout};

/// Min and step of `xs` for `bits`-bit codes, rounded to f16 as stored.
fn fit(xs: impl Iterator<Item = f32> + Clone, bits: u32) -> (f32, f32) {
    let (lo, hi) = xs.fold((f32::INFINITY, f32::NEG_INFINITY), |(a, b), x| {
        (a.min(x), b.max(x))
    });
    let lo = f16::from_f32(lo).to_f32();
    let step = f16::from_f32((hi - lo) / ((1u32 << bits) - 1) as f32).to_f32();
    (lo, step)
}

#[inline]
fn code_of(x: f32, lo: f32, step: f32, bits: u32) -> u8 {
    if step > 0.0 {
        ((x - lo) / step)
            .round()
            .clamp(0.0, ((1u32 << bits) - 1) as f32) as u8
    } else {
        0
    }
}

fn put_pair(out: &mut [u8], lo: f32, step: f32) {
    out[0..2].copy_from_slice(&f16::from_f32(lo).to_le_bytes());
    out[2..4].copy_from_slice(&f16::from_f32(step).to_le_bytes());
}

#[inline]
fn get_pair(block: &[u8]) -> (f32, f32) {
    (
        f16::from_le_bytes([block[0], block[1]]).to_f32(),
        f16::from_le_bytes([block[2], block[3]]).to_f32(),
    )
}

pub(crate) struct KiviKeys {
    d: usize,
    page_tokens: usize,
    group: usize,
    bits: u32,
    layout: BitLayout,
}

impl KiviKeys {
    pub(crate) fn new(d: usize, page_tokens: usize, group: usize, bits: u32) -> Self {
        KiviKeys {
            d,
            page_tokens,
            group,
            bits,
            layout: BitLayout::uniform(d, bits),
        }
    }
}

impl KeyHalf for KiviKeys {
    fn half_bits(&self) -> u8 {
        (2 * self.bits) as u8
    }

    /// `[group][channel] (min, step)`.
    fn side_bytes(&self) -> usize {
        self.page_tokens / self.group * self.d * 4
    }

    fn code_bytes(&self) -> usize {
        self.page_tokens * self.layout.bytes()
    }

    fn residual_bytes(&self) -> usize {
        0
    }

    fn encode(&self, _layer: usize, _head: usize, rows: &[f32], block: KeyBlockMut<'_>) {
        let (d, g, bytes) = (self.d, self.group, self.layout.bytes());
        let mut codes = vec![0u8; self.page_tokens * d];
        for group in 0..self.page_tokens / g {
            for c in 0..d {
                let column = (group * g..(group + 1) * g).map(|j| rows[j * d + c]);
                let (lo, step) = fit(column, self.bits);
                put_pair(&mut block.side[(group * d + c) * 4..], lo, step);
                for j in group * g..(group + 1) * g {
                    codes[j * d + c] = code_of(rows[j * d + c], lo, step, self.bits);
                }
            }
        }
        for (j, token) in codes.chunks_exact(d).enumerate() {
            pack(
                token,
                &self.layout,
                &mut block.codes[j * bytes..(j + 1) * bytes],
            );
        }
    }

    fn decode(&self, _layer: usize, _head: usize, block: KeyBlock<'_>, rows: &mut [f32]) {
        let (d, g, bytes) = (self.d, self.group, self.layout.bytes());
        let mut codes = [0u8; MAX_CODED_DIM];
        let codes = &mut codes[..d];
        for j in 0..self.page_tokens {
            unpack(
                &block.codes[j * bytes..(j + 1) * bytes],
                &self.layout,
                codes,
            );
            for c in 0..d {
                let (lo, step) = get_pair(&block.side[((j / g) * d + c) * 4..]);
                rows[j * d + c] = lo + step * codes[c] as f32;
            }
        }
    }

    fn prepared_len(&self) -> usize {
        self.d
    }

    fn prepare(&self, _layer: usize, _head: usize, query: &[f32], prepared: &mut [f32]) {
        prepared.copy_from_slice(query);
    }

    fn score(&self, block: KeyBlock<'_>, prepared: &[f32], rows: ScoreRows, scores: &mut [f32]) {
        let (n_qh, visible, stride) = (rows.n_qh, rows.visible, rows.stride);
        let (d, g, bytes) = (self.d, self.group, self.layout.bytes());
        let mut folded = vec![0.0f32; n_qh * d];
        let mut base = vec![0.0f32; n_qh];
        let ones = [1.0f32; 256];
        let levels = Levels {
            hi: &CODE_VALUES,
            lo: &CODE_VALUES,
        };
        for first in (0..visible).step_by(g) {
            let n = g.min(visible - first);
            // Fold the group's per-channel (min, step) into every query; the codes then score
            // as a plain dot product (codes decoded to their values 0, 1, 2, ...).
            for (qh, q) in prepared.chunks_exact(d).enumerate().take(n_qh) {
                let mut b = 0.0;
                for c in 0..d {
                    let (lo, step) = get_pair(&block.side[((first / g) * d + c) * 4..]);
                    folded[qh * d + c] = q[c] * step;
                    b += q[c] * lo;
                }
                base[qh] = b;
            }
            for chunk in (0..n).step_by(ones.len()) {
                let m = ones.len().min(n - chunk);
                let j0 = first + chunk;
                kv_score::score_codes(
                    &block.codes[j0 * bytes..(j0 + m) * bytes],
                    &self.layout,
                    levels,
                    &ones[..m],
                    &folded,
                    &mut scores[j0..],
                    stride,
                );
            }
            for (qh, &b) in base.iter().enumerate() {
                for s in &mut scores[qh * stride + first..qh * stride + first + n] {
                    *s += b;
                }
            }
        }
    }
}

/// The value of every code, as a codebook: KIVI codes stand for themselves (then min + step·code).
static CODE_VALUES: [f32; 256] = {
    let mut values = [0.0f32; 256];
    let mut v = 0;
    while v < 256 {
        values[v] = v as f32;
        v += 1;
    }
    values
};

pub(crate) struct KiviValues {
    d: usize,
    page_tokens: usize,
    /// Channels per value group.
    channel_group: usize,
    bits: u32,
    layout: BitLayout,
}

impl KiviValues {
    /// `channel_group` is used when it divides `d`; otherwise one group spans the head.
    pub(crate) fn new(d: usize, page_tokens: usize, channel_group: usize, bits: u32) -> Self {
        let channel_group = if channel_group > 0 && d.is_multiple_of(channel_group) {
            channel_group
        } else {
            d
        };
        KiviValues {
            d,
            page_tokens,
            channel_group,
            bits,
            layout: BitLayout::uniform(d, bits),
        }
    }

    fn groups(&self) -> usize {
        self.d / self.channel_group
    }

    fn decode_token(
        &self,
        side: &[u8],
        codes_in: &[u8],
        j: usize,
        codes: &mut [u8],
        row: &mut [f32],
    ) {
        let bytes = self.layout.bytes();
        unpack(&codes_in[j * bytes..(j + 1) * bytes], &self.layout, codes);
        for (gi, (chunk, cs)) in row
            .chunks_exact_mut(self.channel_group)
            .zip(codes.chunks_exact(self.channel_group))
            .enumerate()
        {
            let (lo, step) = get_pair(&side[(j * self.groups() + gi) * 4..]);
            for (r, &c) in chunk.iter_mut().zip(cs) {
                *r = lo + step * c as f32;
            }
        }
    }
}

impl ValueHalf for KiviValues {
    fn half_bits(&self) -> u8 {
        (2 * self.bits) as u8
    }

    /// `[token][channel group] (min, step)`.
    fn side_bytes(&self) -> usize {
        self.page_tokens * self.groups() * 4
    }

    fn code_bytes(&self) -> usize {
        self.page_tokens * self.layout.bytes()
    }

    fn encode(
        &self,
        _layer: usize,
        _head: usize,
        rows: &[f32],
        side: &mut [u8],
        codes_out: &mut [u8],
    ) {
        let (d, cg, bytes) = (self.d, self.channel_group, self.layout.bytes());
        let mut codes = [0u8; MAX_CODED_DIM];
        let codes = &mut codes[..d];
        for j in 0..self.page_tokens {
            let row = &rows[j * d..(j + 1) * d];
            for gi in 0..self.groups() {
                let chunk = &row[gi * cg..(gi + 1) * cg];
                let (lo, step) = fit(chunk.iter().copied(), self.bits);
                put_pair(&mut side[(j * self.groups() + gi) * 4..], lo, step);
                for (c, &x) in chunk.iter().enumerate() {
                    codes[gi * cg + c] = code_of(x, lo, step, self.bits);
                }
            }
            pack(
                codes,
                &self.layout,
                &mut codes_out[j * bytes..(j + 1) * bytes],
            );
        }
    }

    fn decode(&self, _layer: usize, _head: usize, block: ValueBlock<'_>, rows: &mut [f32]) {
        let (d, side, codes_in) = (self.d, block.side, block.codes);
        let mut codes = [0u8; MAX_CODED_DIM];
        for j in 0..self.page_tokens {
            self.decode_token(
                side,
                codes_in,
                j,
                &mut codes[..d],
                &mut rows[j * d..(j + 1) * d],
            );
        }
    }

    fn accumulate(&self, block: ValueBlock<'_>, weights: &[f32], rows: ScoreRows, acc: &mut [f32]) {
        let (n_qh, visible, stride) = (rows.n_qh, rows.visible, rows.stride);
        let (d, side, codes_in) = (self.d, block.side, block.codes);
        let mut codes = [0u8; MAX_CODED_DIM];
        let mut row = [0.0f32; MAX_CODED_DIM];
        let (codes, row) = (&mut codes[..d], &mut row[..d]);
        for j in 0..visible {
            if (0..n_qh).all(|qh| weights[qh * stride + j] == 0.0) {
                continue;
            }
            self.decode_token(side, codes_in, j, codes, row);
            for (qh, acc_row) in acc.chunks_exact_mut(d).enumerate().take(n_qh) {
                let w = weights[qh * stride + j];
                if w != 0.0 {
                    axpy_f32(w, row, acc_row);
                }
            }
        }
    }

    fn finish(&self, _layer: usize, _head: usize, _acc_row: &mut [f32]) {}
}
