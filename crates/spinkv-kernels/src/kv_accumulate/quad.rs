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
    #[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
    if let Some(setup) = swizzle128::Setup::new(r.layout, r.levels) {
        // SAFETY: this build has SIMD128; the setup is `r`'s layout's; shapes checked by the
        // caller.
        return unsafe { setup.accumulate(r, weights, stride, acc) };
    }
    let grid = GridLevels::new(r.layout, r.levels);
    let levels = grid.as_ref().map_or(r.levels, GridLevels::levels);
    let decoder = unsafe { RowDecoder::new(r.layout, levels) };
    let decode = |at: usize, row: &mut [f32]| unsafe { decoder.decode(r.codes, at, levels, row) };
    let axpy = |w: f32, x: &[f32], y: &mut [f32]| unsafe { axpy(w, x, y) };
    let step = grid.as_ref().map(|g| g.step);
    accumulate_code_rows(r, step, weights, stride, acc, decode, axpy);
}

/// [`accumulate_codes`] over a run of pages of `page_rows` rows each (a multiple of the grid's
/// chunk, so chunks start at each page's first row as they do page by page), with the grid and
/// the cuts set up once for the run; `false` (nothing done) for a layout the SIMD128 scan does
/// not take.
///
/// # Safety
/// SIMD128; shapes as checked by `super::accumulate_code_pages`.
#[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn accumulate_pages(
    pages: &[&[u8]],
    page_rows: usize,
    layout: &crate::codes::CodeLayout,
    levels: crate::codes::Levels<'_>,
    scales: &[f32],
    weights: &[f32],
    stride: usize,
    acc: &mut [f32],
) -> bool {
    debug_assert!(page_rows.is_multiple_of(super::grid::CHUNK));
    let Some(setup) = swizzle128::Setup::new(layout, levels) else {
        return false;
    };
    let rows = scales.len();
    for (p, page) in pages.iter().enumerate().take(rows.div_ceil(page_rows)) {
        let first = p * page_rows;
        let r = CodedRows::new(page, layout, levels, &scales[first..rows.min(first + page_rows)]);
        // SAFETY: SIMD128 (caller); the page's rows and weight columns lie inside the checked
        // shapes.
        unsafe { setup.accumulate(r, &weights[first..], stride, acc) };
    }
    true
}
