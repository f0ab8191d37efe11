//! NEON / SIMD128 accumulation, one body for both 4-lane ISAs: each value row with a non-zero
//! weight is decoded (codes) or widened (fp16) once into an aligned row buffer, then added to
//! every query head's sum.

use super::accumulate_rows;
use crate::codes::quad::RowDecoder;
use crate::codes::CodedRows;
use crate::simd::RowBuf;
use crate::vec_f32::quad::axpy;
use half::f16;

/// # Safety
/// NEON or SIMD128 (whichever this build has); shapes as checked by `super::accumulate_f16`.
pub unsafe fn accumulate_f16(
    values: &[f16],
    d: usize,
    weights: &[f32],
    stride: usize,
    acc: &mut [f32],
) {
    let mut row = RowBuf::new();
    // SAFETY (both closures): same target features as this function; equal lengths.
    let decode = |j: usize, row: &mut [f32]| unsafe {
        crate::convert::quad::f16_to_f32(&values[j * d..(j + 1) * d], row)
    };
    let axpy = |w: f32, x: &[f32], y: &mut [f32]| unsafe { axpy(w, x, y) };
    let rows = values.len() / d;
    accumulate_rows(&mut row.0[..d], rows, None, weights, stride, acc, decode, axpy);
}

/// # Safety
/// NEON or SIMD128 (whichever this build has); shapes as checked by `super::accumulate_codes`.
pub unsafe fn accumulate_codes(
    r: CodedRows<'_>,
    weights: &[f32],
    stride: usize,
    acc: &mut [f32],
) {
    let (codes, layout, levels, scales) = (r.codes, r.layout, r.levels, r.scales);
    let (d, bytes) = (layout.d, layout.bytes());
    let mut row = RowBuf::new();
    // SAFETY (all unsafe here): same target features as this function; every row lies inside
    // `codes` (checked), the levels were checked against the layout.
    let decoder = unsafe { RowDecoder::new(layout, levels) };
    let decode = |j: usize, row: &mut [f32]| unsafe { decoder.decode(codes, j * bytes, levels, row) };
    let axpy = |w: f32, x: &[f32], y: &mut [f32]| unsafe { axpy(w, x, y) };
    let rows = scales.len();
    accumulate_rows(&mut row.0[..d], rows, Some(scales), weights, stride, acc, decode, axpy);
}
