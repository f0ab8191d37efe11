//! NEON / SIMD128 scoring, one body for both 4-lane ISAs: each key row is decoded (codes) or
//! widened (fp16) once into an aligned row buffer, then dotted with every query head.

use crate::codes::quad::RowDecoder;
use crate::codes::CodedRows;
use crate::simd::RowBuf;
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
    let mut row = RowBuf::new();
    let row = &mut row.0[..d];
    for (j, key) in keys.chunks_exact(d).enumerate() {
        // SAFETY: same target features as this function; equal lengths.
        unsafe { crate::convert::quad::f16_to_f32(key, row) };
        for (qh, q) in queries.chunks_exact(d).enumerate() {
            // SAFETY: as above.
            scores[qh * stride + j] = unsafe { crate::vec_f32::quad::dot(q, row) };
        }
    }
}

/// # Safety
/// NEON or SIMD128 (whichever this build has); shapes as checked by `super::score_codes`.
pub unsafe fn score_codes(r: CodedRows<'_>, queries: &[f32], scores: &mut [f32], stride: usize) {
    let (codes, layout, levels, scales) = (r.codes, r.layout, r.levels, r.scales);
    let (d, bytes) = (layout.d, layout.bytes());
    let mut row = RowBuf::new();
    let row = &mut row.0[..d];
    // SAFETY: same target features as this function; every row lies inside `codes`
    // (checked), the levels were checked against the layout.
    unsafe {
        let decoder = RowDecoder::new(layout, levels);
        for (j, &scale) in scales.iter().enumerate() {
            decoder.decode(codes, j * bytes, levels, row);
            for (qh, q) in queries.chunks_exact(d).enumerate() {
                scores[qh * stride + j] = scale * crate::vec_f32::quad::dot(q, row);
            }
        }
    }
}
