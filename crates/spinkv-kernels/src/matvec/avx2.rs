//! AVX2/FMA/F16C matvec: one row at a time, streamed start to end; each row is the canonical
//! 16-lane dot product (two 8-lane FMA chains, see `crate::canon`).
//!
//! Why not several rows per pass (sharing each activation load)? Measured on the 2-core dev
//! machine with a 49152×576 f16 matrix (DRAM-bound): 1 row/pass ~20–33 GB/s, 2–8 interleaved
//! rows/pass ~8–11 GB/s — the interleaved streams defeat the hardware prefetcher, and decode
//! speed is that bandwidth. The activation vector stays in L1 either way.

use crate::simd::avx2::{dot16, Lanes};
use crate::WeightRef;
use std::ops::Range;

/// # Safety
/// CPU must support AVX2+FMA+F16C.
#[target_feature(enable = "avx2,fma,f16c")]
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

/// # Safety
/// CPU must support AVX2+FMA+F16C.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn matvec_lanes<L: Lanes>(w: &[L], k: usize, x: &[f32], rows: Range<usize>, y: &mut [f32]) {
    super::check_shapes(w.len(), k, x, &rows, y);
    for (out, r) in y.iter_mut().zip(rows) {
        // SAFETY: r < rows.end, so row r (k elements) lies inside w per the shape check.
        *out = unsafe { row_dot(w.as_ptr().add(r * k), x) };
    }
}

/// # Safety
/// AVX2+FMA+F16C; `row` valid for `x.len()` elements.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn row_dot<L: Lanes>(row: *const L, x: &[f32]) -> f32 {
    // SAFETY: row and x hold x.len() elements.
    unsafe { dot16(row, x.as_ptr(), x.len()) }
}
