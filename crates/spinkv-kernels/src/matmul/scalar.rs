//! Reference batched matmul: each output a canonical dot product (see `crate::canon`); Q8_0
//! weights take the Q8_0 × Q8_0 arithmetic of `crate::q8dot`.

use crate::WeightRef;
use std::ops::Range;

pub fn matmul(w: WeightRef<'_>, k: usize, x: &[f32], rows: Range<usize>, y: &mut [f32]) {
    super::check_shapes(w, k, x, &rows, y);
    match w {
        WeightRef::F16(w) => matmul_generic(w, |v| v.to_f32(), k, x, rows, y),
        WeightRef::Bf16(w) => matmul_generic(w, |v| v.to_f32(), k, x, rows, y),
        WeightRef::F32(w) => matmul_generic(w, |v| v, k, x, rows, y),
        // SAFETY: scalar runs everywhere.
        WeightRef::Q8_0(q) => unsafe {
            crate::q8dot::matmul_on(crate::Isa::Scalar, q, k, x, rows, y)
        },
    }
}

fn matmul_generic<T: Copy>(
    w: &[T],
    widen: impl Fn(T) -> f32,
    k: usize,
    x: &[f32],
    rows: Range<usize>,
    y: &mut [f32],
) {
    let n_out = rows.len();
    for (x_row, y_row) in x.chunks_exact(k).zip(y.chunks_exact_mut(n_out.max(1))) {
        for (out, r) in y_row.iter_mut().zip(rows.clone()) {
            let w_row = &w[r * k..(r + 1) * k];
            *out = crate::canon::dot(w_row, x_row, &widen);
        }
    }
}
