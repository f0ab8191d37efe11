//! Per-token scales stored in one byte on a logarithmic grid whose range is fitted per
//! (page, head): `[lo: f16][hi: f16][code: u8 × tokens]`. Code 0 is an exact zero; codes
//! 1..=255 are `2^(lo + (code-1)·(hi-lo)/254)`. A page's norms rarely span more than a few
//! octaves, so the relative error is far below the 2^(1/16) steps of a fixed global range.

use half::f16;

use super::paged::MAX_RUN_PAGES;
use crate::kernels::{f16_to_f32, scales};

/// Bytes of a block of `tokens` log-u8 scales.
pub(crate) fn log_u8_bytes(tokens: usize) -> usize {
    4 + tokens
}

/// Encodes non-negative `values` into `out` (`log_u8_bytes(values.len())` bytes) and writes the
/// values the decoder will see back into `values`.
pub(crate) fn encode_log_u8(values: &mut [f32], out: &mut [u8]) {
    let logs = values
        .iter()
        .filter(|v| **v > 1e-30 && v.is_finite())
        .map(|v| v.log2());
    let (mut lo, mut hi) = logs.fold((f32::INFINITY, f32::NEG_INFINITY), |(a, b), l| {
        (a.min(l), b.max(l))
    });
    if lo > hi {
        (lo, hi) = (0.0, 0.0);
    }
    let (lo16, hi16) = (
        f16::from_f32(lo.max(-65000.0)),
        f16::from_f32(hi.min(65000.0)),
    );
    out[0..2].copy_from_slice(&lo16.to_le_bytes());
    out[2..4].copy_from_slice(&hi16.to_le_bytes());
    let (lo, hi) = (lo16.to_f32(), hi16.to_f32());
    let step = (hi - lo) / 254.0;
    for (v, code) in values.iter_mut().zip(&mut out[4..]) {
        *code = if *v > 1e-30 && v.is_finite() {
            let c = if step > 0.0 {
                ((v.log2() - lo) / step).round()
            } else {
                0.0
            };
            1 + c.clamp(0.0, 254.0) as u8
        } else {
            0
        };
        *v = decode_one(lo, step, *code);
    }
}

/// A block's grid from its header: `lo` and the step between codes.
fn log_u8_grid(block: &[u8]) -> (f32, f32) {
    // `to_f32_const` is plain bit arithmetic that inlines; `to_f32` calls out to a run-time
    // F16C check, and this runs for every page of every head a scan reads (2.3 % of a decode
    // attention's samples at depth 7,680).
    let lo = f16::from_le_bytes([block[0], block[1]]).to_f32_const();
    let hi = f16::from_le_bytes([block[2], block[3]]).to_f32_const();
    grid_of(lo, hi)
}

/// `lo` and the step between codes of a block whose codes span `lo..=hi`.
#[inline]
fn grid_of(lo: f32, hi: f32) -> (f32, f32) {
    (lo, (hi - lo) / 254.0)
}

/// Decodes the first `values.len()` scales of a block written by [`encode_log_u8`]
/// (vectorised; the same values as [`decode_one`] on every ISA).
pub(crate) fn decode_log_u8(block: &[u8], values: &mut [f32]) {
    let (lo, step) = log_u8_grid(block);
    scales::decode_log_u8(&block[4..4 + values.len()], lo, step, values);
}

/// [`decode_log_u8`] of a run of consecutive pages (at most [`MAX_RUN_PAGES`]) into `values`
/// back to back: page `i`'s block gives `values[i·page_tokens..]`, up to `page_tokens` scales.
/// One kernel call for the run, so the pages' decoding overlaps; the pages' grids are widened
/// in one call too (F16C where present: an exact conversion, so the same grids as
/// [`log_u8_grid`]), where a scalar conversion per page took ~2.5 % of a decode's attention
/// at depth 7,680 (AMD EPYC Zen 4).
pub(crate) fn decode_log_u8_pages<'a>(
    blocks: impl Iterator<Item = &'a [u8]>,
    page_tokens: usize,
    values: &mut [f32],
) {
    let mut runs = [scales::LogRun {
        codes: &[],
        lo: 0.0,
        step: 0.0,
    }; MAX_RUN_PAGES];
    // Each page's `lo` and `hi`, in page order.
    let mut bounds = [f16::ZERO; 2 * MAX_RUN_PAGES];
    let (mut n, mut first) = (0, 0);
    for block in blocks {
        if first >= values.len() {
            break;
        }
        assert!(
            n < MAX_RUN_PAGES,
            "decode_log_u8_pages: run longer than MAX_RUN_PAGES"
        );
        let count = page_tokens.min(values.len() - first);
        bounds[2 * n] = f16::from_le_bytes([block[0], block[1]]);
        bounds[2 * n + 1] = f16::from_le_bytes([block[2], block[3]]);
        runs[n].codes = &block[4..4 + count];
        n += 1;
        first += count;
    }
    assert_eq!(
        first,
        values.len(),
        "decode_log_u8_pages: fewer pages than the scales"
    );
    let mut grids = [0.0f32; 2 * MAX_RUN_PAGES];
    f16_to_f32(&bounds[..2 * n], &mut grids[..2 * n]);
    for (run, grid) in runs[..n].iter_mut().zip(grids.chunks_exact(2)) {
        (run.lo, run.step) = grid_of(grid[0], grid[1]);
    }
    scales::decode_log_u8_runs(&runs[..n], values);
}

/// One scale: `2^(lo + (code-1)·step)` through spinkv-kernels' fixed-polynomial `exp2`, so
/// encoder write-back, per-token reads and the vectorised decoder agree bit for bit.
#[inline]
fn decode_one(lo: f32, step: f32, code: u8) -> f32 {
    if code == 0 {
        0.0
    } else {
        scales::exp2(lo + (code - 1) as f32 * step)
    }
}

/// Runs `f` on `n` zeroed floats (a page's scales in the attention loop), on the stack when
/// they fit: no allocation or full-array clearing per page.
pub(crate) use crate::kernels::with_floats;

/// Encodes `values` as little-endian halves and writes back what the decoder will see.
pub(crate) fn encode_f16(values: &mut [f32], out: &mut [u8]) {
    for (v, bytes) in values.iter_mut().zip(out.chunks_exact_mut(2)) {
        let h = f16::from_f32(*v);
        bytes.copy_from_slice(&h.to_le_bytes());
        *v = h.to_f32();
    }
}

/// Decodes the first `values.len()` scales of an f16 block.
pub(crate) fn decode_f16(block: &[u8], values: &mut [f32]) {
    for (v, bytes) in values.iter_mut().zip(block.chunks_exact(2)) {
        *v = f16::from_le_bytes([bytes[0], bytes[1]]).to_f32();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_u8_is_accurate_within_a_page_range() {
        let original: Vec<f32> = (0..32).map(|i| 3.0 + i as f32 * 0.9).collect();
        let mut values = original.clone();
        let mut block = vec![0u8; log_u8_bytes(32)];
        encode_log_u8(&mut values, &mut block);
        let mut decoded = vec![0.0; 32];
        decode_log_u8(&block, &mut decoded);
        assert_eq!(decoded, values);
        for (a, b) in original.iter().zip(&decoded) {
            assert!((a / b - 1.0).abs() < 0.005, "{a} vs {b}");
        }
    }

    /// A run's grids, widened together, are each page's own: every scale of the run as
    /// [`decode_log_u8`] gives it page by page, for any bytes (subnormal, infinite and NaN
    /// bounds included) and a short last page.
    #[test]
    fn a_run_decodes_as_its_pages_do() {
        let mut seed = 0x9e37_79b9_u32;
        let mut byte = move || {
            seed ^= seed << 13;
            seed ^= seed >> 17;
            seed ^= seed << 5;
            (seed >> 24) as u8
        };
        let page_tokens = 32;
        let specials = [
            0x0000u16, 0x0001, 0x03ff, 0x7c00, 0xfc00, 0x7e00, 0x7d00, 0x8001,
        ];
        for trial in 0..200 {
            let pages = 1 + trial % MAX_RUN_PAGES;
            let mut blocks: Vec<Vec<u8>> = (0..pages)
                .map(|_| (0..log_u8_bytes(page_tokens)).map(|_| byte()).collect())
                .collect();
            if trial % 4 == 0 {
                let special = specials[trial / 4 % specials.len()].to_le_bytes();
                let at = 2 * (trial / 8 % 2);
                blocks[trial % pages][at..at + 2].copy_from_slice(&special);
            }
            let tokens = (pages - 1) * page_tokens + 1 + trial % page_tokens;
            let mut run = vec![0.0f32; tokens];
            decode_log_u8_pages(blocks.iter().map(|b| b.as_slice()), page_tokens, &mut run);
            for (i, block) in blocks.iter().enumerate() {
                let first = i * page_tokens;
                let count = page_tokens.min(tokens - first);
                let mut page = vec![0.0f32; count];
                decode_log_u8(block, &mut page);
                let got = &run[first..first + count];
                assert!(
                    got.iter()
                        .zip(&page)
                        .all(|(a, b)| a.to_bits() == b.to_bits()),
                    "trial {trial} page {i}"
                );
            }
        }
    }

    #[test]
    fn zeros_and_constant_blocks_survive() {
        let mut values = vec![0.0, 2.0, 2.0, 0.0];
        let mut block = vec![0u8; log_u8_bytes(4)];
        encode_log_u8(&mut values, &mut block);
        assert_eq!(values, [0.0, 2.0, 2.0, 0.0]);
        let mut zeros = vec![0.0; 3];
        let mut block = vec![0u8; log_u8_bytes(3)];
        encode_log_u8(&mut zeros, &mut block);
        assert_eq!(zeros, [0.0; 3]);
    }
}
