//! NEON accumulation: each value row with a non-zero weight is decoded (codes) or
//! widened (fp16) once into an aligned row buffer, then added to every query head's sum.

use super::any_weight;
use crate::codes::neon::RowDecoder;
use crate::codes::{CodeLayout, Levels};
use crate::simd::RowBuf;
use half::f16;

/// # Safety
/// aarch64; shapes as checked by `super::accumulate_f16`.
pub unsafe fn accumulate_f16(
    values: &[f16],
    d: usize,
    weights: &[f32],
    stride: usize,
    acc: &mut [f32],
) {
    let n_qh = acc.len() / d;
    let mut row = RowBuf::new();
    let row = &mut row.0[..d];
    for (j, value) in values.chunks_exact(d).enumerate() {
        if !any_weight(weights, stride, n_qh, j) {
            continue;
        }
        // SAFETY: same target features as this function; equal lengths.
        unsafe { crate::convert::neon::f16_to_f32(value, row) };
        for (qh, acc_row) in acc.chunks_exact_mut(d).enumerate() {
            let w = weights[qh * stride + j];
            if w != 0.0 {
                // SAFETY: as above.
                unsafe { crate::vec_f32::neon::axpy_f32(w, row, acc_row) };
            }
        }
    }
}

/// # Safety
/// aarch64; shapes as checked by `super::accumulate_codes`.
pub unsafe fn accumulate_codes(
    codes: &[u8],
    layout: &CodeLayout,
    levels: Levels<'_>,
    scales: &[f32],
    weights: &[f32],
    stride: usize,
    acc: &mut [f32],
) {
    let (d, bytes) = (layout.d, layout.bytes());
    let n_qh = acc.len() / d;
    let mut row = RowBuf::new();
    let row = &mut row.0[..d];
    // SAFETY: same target features as this function; every row lies inside `codes`
    // (checked), the levels were checked against the layout.
    unsafe {
        let decoder = RowDecoder::new(layout, levels);
        for (j, &scale) in scales.iter().enumerate() {
            if !any_weight(weights, stride, n_qh, j) {
                continue;
            }
            decoder.decode(codes, j * bytes, levels, row);
            for (qh, acc_row) in acc.chunks_exact_mut(d).enumerate() {
                let w = weights[qh * stride + j] * scale;
                if w != 0.0 {
                    crate::vec_f32::neon::axpy_f32(w, row, acc_row);
                }
            }
        }
    }
}
