//! Reference accumulation: decode a row, then one axpy per query head with a non-zero weight.

use super::any_weight;
use crate::codes::{CodeLayout, Levels};
use half::f16;

pub fn accumulate_f16(values: &[f16], d: usize, weights: &[f32], stride: usize, acc: &mut [f32]) {
    let n_qh = acc.len() / d;
    let mut row = [0.0f32; crate::MAX_CODED_DIM];
    let row = &mut row[..d];
    for (j, value) in values.chunks_exact(d).enumerate() {
        if !any_weight(weights, stride, n_qh, j) {
            continue;
        }
        crate::convert::scalar::f16_to_f32(value, row);
        for (qh, acc_row) in acc.chunks_exact_mut(d).enumerate() {
            let w = weights[qh * stride + j];
            if w != 0.0 {
                crate::vec_f32::scalar::axpy_f32(w, row, acc_row);
            }
        }
    }
}

pub fn accumulate_codes(
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
    let mut row = [0.0f32; crate::MAX_CODED_DIM];
    let row = &mut row[..d];
    for (j, &scale) in scales.iter().enumerate() {
        if !any_weight(weights, stride, n_qh, j) {
            continue;
        }
        crate::codes::scalar::dequantize(&codes[j * bytes..(j + 1) * bytes], layout, levels, row);
        for (qh, acc_row) in acc.chunks_exact_mut(d).enumerate() {
            let w = weights[qh * stride + j] * scale;
            if w != 0.0 {
                crate::vec_f32::scalar::axpy_f32(w, row, acc_row);
            }
        }
    }
}
