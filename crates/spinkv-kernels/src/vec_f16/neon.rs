//! NEON mixed f16/f32 dot / axpy: halves widen with FCVTL.

use crate::simd::neon::{dot16, Lanes};
use core::arch::aarch64::*;
use half::f16;

/// # Safety
/// aarch64; `x.len() == y.len()`.
pub unsafe fn dot_f16(x: &[f16], y: &[f32]) -> f32 {
    assert_eq!(x.len(), y.len());
    // SAFETY: both slices hold x.len() elements.
    unsafe { dot16(x.as_ptr(), y.as_ptr(), x.len()) }
}

/// # Safety
/// aarch64; `x.len() == y.len()`.
pub unsafe fn axpy_f16(a: f32, x: &[f16], y: &mut [f32]) {
    assert_eq!(x.len(), y.len());
    let n = x.len();
    let (xp, yp) = (x.as_ptr(), y.as_mut_ptr());
    let mut i = 0;
    // SAFETY: i + 4 <= n for both slices.
    unsafe {
        let va = vdupq_n_f32(a);
        while i + 4 <= n {
            vst1q_f32(
                yp.add(i),
                vfmaq_f32(vld1q_f32(yp.add(i)), va, f16::load4(xp.add(i))),
            );
            i += 4;
        }
    }
    for j in i..n {
        y[j] = a.mul_add(x[j].to_f32(), y[j]);
    }
}
