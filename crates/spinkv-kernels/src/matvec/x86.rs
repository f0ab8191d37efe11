//! AVX2 / AVX-512 matvec: one row at a time, streamed start to end; each row is the canonical
//! 16-lane dot product (`dot16`: two 8-lane FMA chains on AVX2, one 16-lane chain on AVX-512).
//!
//! Why not several rows per pass (sharing each activation load)? Measured on the 2-core dev
//! machine with a 49152×576 f16 matrix (DRAM-bound), AVX2: 1 row/pass ~20–33 GB/s, 2–8
//! interleaved rows/pass ~8–11 GB/s — the interleaved streams defeat the hardware prefetcher,
//! and decode speed is that bandwidth. The activation vector stays in L1 either way.

use crate::simd::x86::{dot16, Vector};
use crate::simd::Lanes;
use crate::WeightRef;
use std::ops::Range;

crate::isa::x86_kernels! {
    fn matvec(w: WeightRef<'_>, k: usize, x: &[f32], rows: Range<usize>, y: &mut [f32]);
}

/// # Safety
/// `V`'s features.
#[inline(always)]
unsafe fn matvec<V: Vector>(w: WeightRef<'_>, k: usize, x: &[f32], rows: Range<usize>, y: &mut [f32]) {
    // SAFETY: `V`'s features (caller).
    unsafe {
        crate::weight::with_slice!(
            w,
            |w| matvec_lanes::<V, _>(w, k, x, rows, y),
            |q| crate::q8dot::matvec_on(V::ISA, q, k, x, rows, y)
        )
    }
}

/// # Safety
/// `V`'s features.
#[inline(always)]
unsafe fn matvec_lanes<V: Vector, L: Lanes>(
    w: &[L],
    k: usize,
    x: &[f32],
    rows: Range<usize>,
    y: &mut [f32],
) {
    super::check_shapes(w.len(), k, x, &rows, y);
    for (out, r) in y.iter_mut().zip(rows) {
        // SAFETY: r < rows.end, so row r (k elements) lies inside w per the shape check.
        *out = unsafe { dot16::<V, L>(w.as_ptr().add(r * k), x.as_ptr(), x.len()) };
    }
}
