//! NEON / SIMD128 scoring, one body for both 4-lane ISAs: each key row is decoded (codes) or
//! widened (fp16) once into an aligned row buffer, then dotted with every query head.

use super::{score_code_rows, score_f16_rows};
use crate::codes::quad::RowDecoder;
use crate::codes::CodedRows;
use half::f16;

/// # Safety
/// NEON or SIMD128 (whichever this build has); shapes as checked by `super::score_f16`.
pub unsafe fn score_f16(
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
