//! Reference accumulation: decode a row, then one axpy per query head with a non-zero weight.

use super::grid::GridLevels;
use super::{accumulate_code_rows, accumulate_f16_rows};
use crate::codes::CodedRows;
use crate::convert::scalar::f16_to_f32;
use crate::vec_f32::scalar::axpy;
use half::f16;

pub fn accumulate_f16(values: &[f16], d: usize, weights: &[f32], stride: usize, acc: &mut [f32]) {
    accumulate_f16_rows(values, d, weights, stride, acc, f16_to_f32, axpy);
}

/// Codes of at most 4 bits on the integer grid (see [`super::grid`]), wider ones in f32.
pub fn accumulate_codes(r: CodedRows<'_>, weights: &[f32], stride: usize, acc: &mut [f32]) {
    let bytes = r.layout.bytes();
    let grid = GridLevels::new(r.layout, r.levels);
    let levels = grid.as_ref().map_or(r.levels, GridLevels::levels);
    let decode = |at: usize, row: &mut [f32]| {
        crate::codes::scalar::dequantize(&r.codes[at..at + bytes], r.layout, levels, row)
    };
    let step = grid.as_ref().map(|g| g.step);
    accumulate_code_rows(r, step, weights, stride, acc, decode, axpy);
}
