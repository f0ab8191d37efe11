//! Reference matvec: each row a canonical dot product (see `crate::canon`); Q8_0 weights take
//! the Q8_0 × Q8_0 arithmetic of `crate::q8dot`.

use crate::canon;
use crate::WeightRef;
use std::ops::Range;

pub fn matvec(w: WeightRef<'_>, k: usize, x: &[f32], rows: Range<usize>, y: &mut [f32]) {
    super::check_shapes(w.len(), k, x, &rows, y);
    let dot = |r: usize| {
        let span = r * k..(r + 1) * k;
        match w {
            WeightRef::F16(w) => canon::dot(&w[span], x, |v| v.to_f32()),
            WeightRef::Bf16(w) => canon::dot(&w[span], x, |v| v.to_f32()),
            WeightRef::F32(w) => canon::dot(&w[span], x, |v| v),
            WeightRef::Q8_0(_) => unreachable!("Q8_0 rows go through q8dot"),
        }
    };
    match w {
        // SAFETY: scalar runs everywhere.
        WeightRef::Q8_0(q) => unsafe {
            crate::q8dot::matvec_on(crate::Isa::Scalar, q, k, x, rows, y)
        },
        _ => {
            for (out, r) in y.iter_mut().zip(rows) {
                *out = dot(r);
            }
        }
    }
}
