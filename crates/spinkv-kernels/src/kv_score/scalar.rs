//! Reference scoring: decode a row, then one dot product per query head.

use super::{score_code_rows, score_f16_rows};
use crate::codes::CodedRows;
use crate::convert::scalar::f16_to_f32;
use crate::vec_f32::scalar::dot;
use half::f16;

pub fn score_f16(keys: &[f16], d: usize, queries: &[f32], scores: &mut [f32], stride: usize) {
    score_f16_rows(keys, d, queries, scores, stride, f16_to_f32, dot);
}

pub fn score_codes(r: CodedRows<'_>, queries: &[f32], scores: &mut [f32], stride: usize) {
    let bytes = r.layout.bytes();
    let decode = |at: usize, row: &mut [f32]| {
        crate::codes::scalar::dequantize(&r.codes[at..at + bytes], r.layout, r.levels, row)
    };
    score_code_rows(r, queries, scores, stride, decode, dot);
}
