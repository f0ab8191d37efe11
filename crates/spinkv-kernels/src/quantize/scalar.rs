//! Reference snapping: a binary search over each channel's sorted thresholds.

use super::Codebooks;

pub fn quantize(books: Codebooks<'_>, y: &[f32], codes: &mut [u8], recon: &mut [f32]) {
    for (first, len, t, l, _) in books.runs() {
        for c in first..first + len {
            let code = t.partition_point(|&t| t < y[c]);
            codes[c] = code as u8;
            recon[c] = l[code];
        }
    }
}
