//! AVX2 / AVX-512 matvec: one row at a time, streamed start to end; each row is the canonical
//! 16-lane dot product (`dot16`: two 8-lane FMA chains on AVX2, one 16-lane chain on AVX-512).
//!
//! Why not several rows per pass (sharing each activation load)? Measured on the 2-core dev
//! machine with a 49152×576 f16 matrix (DRAM-bound), AVX2: 1 row/pass ~20–33 GB/s, 2–8
//! interleaved rows/pass ~8–11 GB/s — the interleaved streams defeat the hardware prefetcher,
//! and decode speed is that bandwidth. The activation vector stays in L1 either way.
//!
//! Where [`crate::prefetch::weight_hints`] says so (CPUs without AVX-512), each row asks for the
//! lines [`WEIGHT_AHEAD`] bytes past it before its dot product (a software prefetch along the
//! same single stream). On the 2-core AMD EPYC (Zen 3, loaded), 1 thread, it cut the CPU time of
//! a Gemma 3 270M F16 decode (its 262,144 x 640 LM head dominates) by ~7-15 %; on a Zen 4 it
//! made decode 8-13 % slower.

use crate::prefetch::WEIGHT_AHEAD;
use crate::simd::x86::{dot16, Vector};
use crate::simd::Lanes;
use crate::WeightRef;
use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
use std::ops::Range;

crate::isa::x86_kernels! {
    fn matvec(w: WeightRef<'_>, k: usize, x: &[f32], rows: Range<usize>, y: &mut [f32]);
}

/// # Safety
/// `V`'s features.
#[inline(always)]
unsafe fn matvec<V: Vector>(
    w: WeightRef<'_>,
    k: usize,
    x: &[f32],
    rows: Range<usize>,
    y: &mut [f32],
) {
    // SAFETY: `V`'s features (caller).
    unsafe {
        crate::weight::with_slice!(w, |w| matvec_lanes::<V, _>(w, k, x, rows, y), |q| {
            crate::q8dot::matvec_on(V::ISA, q, k, x, rows, y)
        })
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
    let hinted_bytes = if crate::prefetch::weight_hints() {
        k * std::mem::size_of::<L>()
    } else {
        0
    };
    for (out, r) in y.iter_mut().zip(rows) {
        let row = w.as_ptr().wrapping_add(r * k) as *const i8;
        for line in (0..hinted_bytes).step_by(64) {
            // SAFETY: a prefetch is a hint: it never faults, even past the end of `w`; SSE is
            // part of the x86_64 baseline.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(row.wrapping_add(WEIGHT_AHEAD + line)) };
        }
        // SAFETY: r < rows.end, so row r (k elements) lies inside w per the shape check.
        *out = unsafe { dot16::<V, L>(w.as_ptr().add(r * k), x.as_ptr(), x.len()) };
    }
}
