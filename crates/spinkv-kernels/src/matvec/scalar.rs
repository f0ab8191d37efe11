//! Reference matvec: each row a canonical dot product (see `crate::canon`).

use crate::canon;
use crate::WeightRef;
use std::ops::Range;

pub fn matvec(w: WeightRef<'_>, k: usize, x: &[f32], rows: Range<usize>, y: &mut [f32]) {
    super::check_shapes(w.len(), k, x, &rows, y);
    for (out, r) in y.iter_mut().zip(rows) {
        let span = r * k..(r + 1) * k;
        *out = match w {
            WeightRef::F16(w) => canon::dot(&w[span], x, |v| v.to_f32()),
            WeightRef::Bf16(w) => canon::dot(&w[span], x, |v| v.to_f32()),
            WeightRef::F32(w) => canon::dot(&w[span], x, |v| v),
            WeightRef::Q8_0(w) => canon::dot_by_index(x, |i| w.get(span.start + i)),
        };
    }
}
