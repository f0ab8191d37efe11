//! WASM SIMD128 matvec: one row at a time, 4 accumulators of 4 lanes (16 elements of k per step).

use crate::simd::simd128::{hsum, Lanes};
use crate::WeightRef;
use core::arch::wasm32::*;
use std::ops::Range;

/// # Safety
/// Shapes as checked by `super::check_shapes`.
pub unsafe fn matvec(w: WeightRef<'_>, k: usize, x: &[f32], rows: Range<usize>, y: &mut [f32]) {
    crate::weight::with_slice!(w, |w| matvec_lanes(w, k, x, rows, y))
}

fn matvec_lanes<L: Lanes>(w: &[L], k: usize, x: &[f32], rows: Range<usize>, y: &mut [f32]) {
    super::check_shapes(w.len(), k, x, &rows, y);
    for (out, r) in y.iter_mut().zip(rows) {
        // SAFETY: r < rows.end, so row r (k elements) lies inside w per the shape check.
        *out = unsafe { row_dot(w.as_ptr().add(r * k), x) };
    }
}

/// # Safety
/// `row` valid for `x.len()` elements.
#[inline(always)]
unsafe fn row_dot<L: Lanes>(row: *const L, x: &[f32]) -> f32 {
    let k = x.len();
    let xp = x.as_ptr();
    let mut acc = [f32x4_splat(0.0); 4];
    let mut kk = 0;
    // SAFETY (all loads): each covers kk..kk+16 (or +4) <= k, inside the row and x.
    unsafe {
        while kk + 16 <= k {
            for (j, acc) in acc.iter_mut().enumerate() {
                let o = kk + 4 * j;
                let xv = v128_load(xp.add(o) as *const v128);
                *acc = f32x4_add(*acc, f32x4_mul(L::load4(row.add(o)), xv));
            }
            kk += 16;
        }
        while kk + 4 <= k {
            let xv = v128_load(xp.add(kk) as *const v128);
            acc[0] = f32x4_add(acc[0], f32x4_mul(L::load4(row.add(kk)), xv));
            kk += 4;
        }
    }
    let mut sum = hsum(f32x4_add(
        f32x4_add(acc[0], acc[1]),
        f32x4_add(acc[2], acc[3]),
    ));
    for (j, xj) in x.iter().enumerate().skip(kk) {
        // SAFETY: j < k, inside the row.
        sum += unsafe { (*row.add(j)).widen() } * xj;
    }
    sum
}
