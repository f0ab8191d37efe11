//! NEON / SIMD128 accumulation, one body for both 4-lane ISAs: each value row with a non-zero
//! weight is decoded (codes) or widened (fp16) once into an aligned row buffer, then added to
//! every query head's sum.

use super::grid::GridLevels;
use super::{accumulate_code_rows, accumulate_f16_rows};
use crate::codes::quad::RowDecoder;
use crate::codes::CodedRows;
use crate::vec_f32::quad::axpy;
#[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
#[path = "swizzle128.rs"]
mod swizzle128;
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
    // SAFETY (both closures): same target features as this function; equal lengths.
    let convert = |x: &[f16], row: &mut [f32]| unsafe { crate::convert::quad::f16_to_f32(x, row) };
    let axpy = |w: f32, x: &[f32], y: &mut [f32]| unsafe { axpy(w, x, y) };
    accumulate_f16_rows(values, d, weights, stride, acc, convert, axpy);
}

/// # Safety
/// NEON or SIMD128 (whichever this build has); shapes as checked by `super::accumulate_codes`.
pub unsafe fn accumulate_codes(r: CodedRows<'_>, weights: &[f32], stride: usize, acc: &mut [f32]) {
    // SAFETY (all unsafe here): same target features as this function; every row lies inside
    // `codes` (checked), the levels were checked against the layout.
    let grid = GridLevels::new(r.layout, r.levels);
    #[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
    if let Some(grid) = &grid {
        // SAFETY: this build has SIMD128; shapes checked by the caller.
        if unsafe { swizzle128::try_accumulate(r, grid, weights, stride, acc) } {
            return;
        }
    }
    let levels = grid.as_ref().map_or(r.levels, GridLevels::levels);
    let decoder = unsafe { RowDecoder::new(r.layout, levels) };
    let decode = |at: usize, row: &mut [f32]| unsafe { decoder.decode(r.codes, at, levels, row) };
    let axpy = |w: f32, x: &[f32], y: &mut [f32]| unsafe { axpy(w, x, y) };
    let step = grid.as_ref().map(|g| g.step);
    accumulate_code_rows(r, step, weights, stride, acc, decode, axpy);
}
