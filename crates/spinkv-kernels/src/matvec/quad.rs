//! NEON / SIMD128 matvec, one body for both 4-lane ISAs: one row at a time, each row
//! `quad::dot16` — four 4-lane chains over 16 elements of k per step (FMA chains, canonical,
//! on NEON; separate multiply and add on SIMD128, which has no FMA).

#[cfg(target_arch = "aarch64")]
use crate::simd::quad::dot16;
use crate::simd::quad::Lanes;
use crate::WeightRef;
use std::ops::Range;

/// # Safety
/// NEON or SIMD128 (whichever this build has); shapes as checked by `super::check_shapes`.
pub unsafe fn matvec(w: WeightRef<'_>, k: usize, x: &[f32], rows: Range<usize>, y: &mut [f32]) {
    crate::weight::with_slice!(
        w,
        |w| matvec_lanes(w, k, x, rows, y),
        |q| crate::q8dot::matvec_on(crate::simd::quad::ISA, q, k, x, rows, y)
    )
}

fn matvec_lanes<L: Lanes>(w: &[L], k: usize, x: &[f32], rows: Range<usize>, y: &mut [f32]) {
    super::check_shapes(w.len(), k, x, &rows, y);
    // SIMD128: several rows per call, one activation load for two f16 rows (the same sums).
    #[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
    // SAFETY: rows.start..rows.end (y.len() rows of k elements) lie inside w per the shape
    // check; x holds k elements.
    unsafe {
        crate::simd::quad::dot16_rows(w.as_ptr().add(rows.start * k), k, x, y)
    }
    #[cfg(target_arch = "aarch64")]
    for (out, r) in y.iter_mut().zip(rows) {
        // SAFETY: r < rows.end, so row r (k elements) lies inside w per the shape check; x
        // holds k elements.
        *out = unsafe { dot16(w.as_ptr().add(r * k), x.as_ptr(), k) };
    }
}
