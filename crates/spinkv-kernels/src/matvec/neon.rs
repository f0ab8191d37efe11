//! NEON matvec: one row at a time; each row is the canonical 16-lane dot product (four
//! 4-lane FMA chains, see `crate::canon`).

use crate::simd::neon::{dot16, Lanes};
use crate::WeightRef;
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
    // SAFETY: row and x hold x.len() elements.
    unsafe { dot16(row, x.as_ptr(), x.len()) }
}
