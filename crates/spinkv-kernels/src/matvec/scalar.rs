//! Reference matvec: plain loops, f32 accumulation.

use crate::WeightRef;
use std::ops::Range;

pub fn matvec(w: WeightRef<'_>, k: usize, x: &[f32], rows: Range<usize>, y: &mut [f32]) {
    super::check_shapes(w.len(), k, x, &rows, y);
    for (out, r) in y.iter_mut().zip(rows) {
        let span = r * k..(r + 1) * k;
        *out = match w {
            WeightRef::F16(w) => w[span].iter().zip(x).map(|(a, b)| a.to_f32() * b).sum(),
            WeightRef::Bf16(w) => w[span].iter().zip(x).map(|(a, b)| a.to_f32() * b).sum(),
            WeightRef::F32(w) => w[span].iter().zip(x).map(|(a, b)| a * b).sum(),
        };
    }
}
