//! NEON f32 dot / axpy.

use crate::simd::neon::dot16;
use core::arch::aarch64::*;

/// # Safety
/// aarch64 (NEON is baseline); `x.len() == y.len()`.
pub unsafe fn dot_f32(x: &[f32], y: &[f32]) -> f32 {
    assert_eq!(x.len(), y.len());
    // SAFETY: both slices hold x.len() elements.
    unsafe { dot16(x.as_ptr(), y.as_ptr(), x.len()) }
}

/// # Safety
/// aarch64; `x.len() == y.len()`.
pub unsafe fn axpy_f32(a: f32, x: &[f32], y: &mut [f32]) {
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
                vfmaq_f32(vld1q_f32(yp.add(i)), va, vld1q_f32(xp.add(i))),
            );
            i += 4;
        }
    }
    for j in i..n {
        y[j] = a.mul_add(x[j], y[j]);
    }
}

/// # Safety
/// aarch64.
pub unsafe fn scale_f32(x: &mut [f32], a: f32) {
    let n = x.len();
    let p = x.as_mut_ptr();
    let mut i = 0;
    // SAFETY: i + 4 <= n.
    unsafe {
        let va = vdupq_n_f32(a);
        while i + 4 <= n {
            vst1q_f32(p.add(i), vmulq_f32(vld1q_f32(p.add(i)), va));
            i += 4;
        }
    }
    for v in &mut x[i..] {
        *v *= a;
    }
}

/// # Safety
/// aarch64; `x.len() == y.len()`.
pub unsafe fn mul_f32(x: &mut [f32], y: &[f32]) {
    assert_eq!(x.len(), y.len());
    let n = x.len();
    let (xp, yp) = (x.as_mut_ptr(), y.as_ptr());
    let mut i = 0;
    // SAFETY: i + 4 <= n for both slices.
    unsafe {
        while i + 4 <= n {
            vst1q_f32(
                xp.add(i),
                vmulq_f32(vld1q_f32(xp.add(i)), vld1q_f32(yp.add(i))),
            );
            i += 4;
        }
    }
    for j in i..n {
        x[j] *= y[j];
    }
}
