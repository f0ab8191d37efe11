//! NEON / SIMD128 scoring, one body for both 4-lane ISAs: each key row is decoded (codes) or
//! widened (fp16) once into an aligned row buffer, then dotted with every query head. SIMD128
//! scores fp16 keys in blocks of 4 rows instead (`simd128_f16.rs`, the same bits).

use super::{score_code_rows, score_f16_rows};
use crate::codes::quad::RowDecoder;
use crate::codes::CodedRows;
use half::f16;

#[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
#[path = "simd128_f16.rs"]
mod f16_blocks;

/// # Safety
/// NEON or SIMD128 (whichever this build has); shapes as checked by `super::score_f16`.
pub unsafe fn score_f16(
    keys: &[f16],
    d: usize,
    queries: &[f32],
    scores: &mut [f32],
    stride: usize,
) {
    #[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
    if f16_blocks::takes(d) {
        // SAFETY (both calls): SIMD128, this function's target; shapes as checked, the
        // generic rows and score columns lie inside them.
        let generic = |keys: &[f16], scores: &mut [f32]| unsafe {
            score_f16_generic(keys, d, queries, scores, stride)
        };
        return unsafe { f16_blocks::score_f16(keys, d, queries, scores, stride, generic) };
    }
    // SAFETY: as this function's.
    unsafe { score_f16_generic(keys, d, queries, scores, stride) }
}

/// The generic row loop on fp16 keys: each row widened into a buffer, then dotted with every
/// query head (NEON's path, and SIMD128's for what `f16_blocks` leaves).
///
/// # Safety
/// As [`score_f16`].
#[inline(always)]
pub(crate) unsafe fn score_f16_generic(
    keys: &[f16],
    d: usize,
    queries: &[f32],
    scores: &mut [f32],
    stride: usize,
) {
    // SAFETY (both closures): same target features as this function; equal lengths.
    let convert = |x: &[f16], row: &mut [f32]| unsafe { crate::convert::quad::f16_to_f32(x, row) };
    let dot = |q: &[f32], row: &[f32]| unsafe { crate::vec_f32::quad::dot(q, row) };
    score_f16_rows(keys, d, queries, scores, stride, convert, dot);
}

/// # Safety
/// NEON or SIMD128 (whichever this build has); shapes as checked by `super::score_codes`.
pub unsafe fn score_codes(r: CodedRows<'_>, queries: &[f32], scores: &mut [f32], stride: usize) {
    // SAFETY (all unsafe here): same target features as this function; every row lies inside
    // `codes` (checked), the levels were checked against the layout.
    let decoder = unsafe { RowDecoder::new(r.layout, r.levels) };
    let decode = |at: usize, row: &mut [f32]| unsafe { decoder.decode(r.codes, at, r.levels, row) };
    let dot = |q: &[f32], row: &[f32]| unsafe { crate::vec_f32::quad::dot(q, row) };
    score_code_rows(r, queries, scores, stride, decode, dot);
}

/// SIMD128's fp16 key blocks against the generic row loop, bit for bit: head dims the blocks
/// take (and some they leave), 1 to 9 heads, partial blocks, inf/NaN and other special halves.
#[cfg(all(
    target_arch = "wasm32",
    target_feature = "simd128",
    any(test, feature = "parity")
))]
pub(crate) fn f16_blocks_parity() -> crate::test_util::Check {
    use crate::test_util::*;
    let mut rng = Rng::new(51);
    let stride = 37;
    for d in [4usize, 8, 12, 40, 64, 72, 96, 128, 256, 260] {
        for (n_qh, rows) in [(1usize, 1usize), (3, 32), (4, 4), (5, 7), (9, 37), (2, 33)] {
            let keys = super::special_f16_rows(&mut rng, rows, d);
            let queries = random_vec(rng.next_u64(), n_qh * d);
            let mut want = vec![7.0f32; n_qh * stride];
            let mut got = want.clone();
            // SAFETY: SIMD128 (this build); shapes as `super::score_f16` checks them.
            unsafe {
                score_f16_generic(&keys, d, &queries, &mut want, stride);
                score_f16(&keys, d, &queries, &mut got, stride);
            }
            identical_bits(&got, &want, &|| {
                format!("score_f16 blocks vs rows d={d} n_qh={n_qh} rows={rows}")
            })?;
        }
    }
    Ok(())
}
