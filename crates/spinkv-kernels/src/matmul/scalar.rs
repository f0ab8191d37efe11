//! Reference batched matmul: each output a canonical dot product (see `crate::canon`).

use crate::WeightRef;
use std::ops::Range;

pub fn matmul(w: WeightRef<'_>, k: usize, x: &[f32], rows: Range<usize>, y: &mut [f32]) {
    super::check_shapes(w, k, x, &rows, y);
    match w {
        WeightRef::F16(w) => matmul_generic(w, |v| v.to_f32(), k, x, rows, y),
        WeightRef::Bf16(w) => matmul_generic(w, |v| v.to_f32(), k, x, rows, y),
        WeightRef::F32(w) => matmul_generic(w, |v| v, k, x, rows, y),
        WeightRef::Q8_0(w) => {
            let n_out = rows.len();
            for (x_row, y_row) in x.chunks_exact(k).zip(y.chunks_exact_mut(n_out.max(1))) {
                for (out, r) in y_row.iter_mut().zip(rows.clone()) {
                    *out = crate::canon::dot_by_index(x_row, |i| w.get(r * k + i));
                }
            }
        }
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
