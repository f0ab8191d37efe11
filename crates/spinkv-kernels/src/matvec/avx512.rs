//! AVX-512 matvec: one row at a time (see `avx2.rs` for why); each row is the canonical
//! 16-lane dot product (one FMA chain, masked tail; see `crate::canon`).

use crate::simd::avx512::{dot16, Lanes};
use crate::WeightRef;
use std::ops::Range;

/// # Safety
/// CPU must support AVX-512 F/BW/VL (+AVX2/FMA/F16C).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
pub unsafe fn matvec(w: WeightRef<'_>, k: usize, x: &[f32], rows: Range<usize>, y: &mut [f32]) {
    // SAFETY: same target features as this function.
    unsafe {
        match w {
            WeightRef::F16(w) => matvec_lanes(w, k, x, rows, y),
            WeightRef::Bf16(w) => matvec_lanes(w, k, x, rows, y),
            WeightRef::F32(w) => matvec_lanes(w, k, x, rows, y),
        }
    }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
unsafe fn matvec_lanes<L: Lanes>(w: &[L], k: usize, x: &[f32], rows: Range<usize>, y: &mut [f32]) {
    super::check_shapes(w.len(), k, x, &rows, y);
    for (out, r) in y.iter_mut().zip(rows) {
        // SAFETY: r < rows.end, so row r (k elements) lies inside w per the shape check.
        *out = unsafe { row_dot(w.as_ptr().add(r * k), x) };
    }
}

/// # Safety
/// AVX-512; `row` valid for `x.len()` elements.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
unsafe fn row_dot<L: Lanes>(row: *const L, x: &[f32]) -> f32 {
    // SAFETY: row and x hold x.len() elements.
    unsafe { dot16(row, x.as_ptr(), x.len()) }
}
