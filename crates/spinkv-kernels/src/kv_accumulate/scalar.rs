//! Reference accumulation: decode a row, then one axpy per query head with a non-zero weight.

use super::accumulate_rows;
use crate::codes::CodedRows;
use crate::vec_f32::scalar::axpy;
use half::f16;

pub fn accumulate_f16(values: &[f16], d: usize, weights: &[f32], stride: usize, acc: &mut [f32]) {
    let mut row = [0.0f32; crate::MAX_CODED_DIM];
    let rows = values.len() / d;
    let decode = |j: usize, row: &mut [f32]| {
        crate::convert::scalar::f16_to_f32(&values[j * d..(j + 1) * d], row)
    };
    accumulate_rows(&mut row[..d], rows, None, weights, stride, acc, decode, axpy);
}

pub fn accumulate_codes(
    r: CodedRows<'_>,
    weights: &[f32],
    stride: usize,
    acc: &mut [f32],
) {
    let (codes, layout, levels, scales) = (r.codes, r.layout, r.levels, r.scales);
    let (d, bytes) = (layout.d, layout.bytes());
    let mut row = [0.0f32; crate::MAX_CODED_DIM];
    let decode = |j: usize, row: &mut [f32]| {
        crate::codes::scalar::dequantize(&codes[j * bytes..(j + 1) * bytes], layout, levels, row)
    };
    let rows = scales.len();
    accumulate_rows(&mut row[..d], rows, Some(scales), weights, stride, acc, decode, axpy);
}
