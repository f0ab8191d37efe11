//! Reference scoring: decode a row, then one dot product per query head.

use crate::codes::CodedRows;
use half::f16;

pub fn score_f16(keys: &[f16], d: usize, queries: &[f32], scores: &mut [f32], stride: usize) {
    let mut row = [0.0f32; crate::MAX_CODED_DIM];
    let row = &mut row[..d];
    for (j, key) in keys.chunks_exact(d).enumerate() {
        crate::convert::scalar::f16_to_f32(key, row);
        for (qh, q) in queries.chunks_exact(d).enumerate() {
            scores[qh * stride + j] = crate::vec_f32::scalar::dot(q, row);
        }
    }
}

pub fn score_codes(r: CodedRows<'_>, queries: &[f32], scores: &mut [f32], stride: usize) {
    let (codes, layout, levels, scales) = (r.codes, r.layout, r.levels, r.scales);
    let (d, bytes) = (layout.d, layout.bytes());
    let mut row = [0.0f32; crate::MAX_CODED_DIM];
    let row = &mut row[..d];
    for (j, &scale) in scales.iter().enumerate() {
        crate::codes::scalar::dequantize(&codes[j * bytes..(j + 1) * bytes], layout, levels, row);
        for (qh, q) in queries.chunks_exact(d).enumerate() {
            scores[qh * stride + j] = scale * crate::vec_f32::scalar::dot(q, row);
        }
    }
}
