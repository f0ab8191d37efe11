//! WASM SIMD128 mixed f16/f32 dot / axpy: halves widen by exact bit manipulation.

use crate::simd::simd128::{hsum, Lanes};
use core::arch::wasm32::*;
use half::f16;

/// # Safety
/// `x.len() == y.len()`.
pub unsafe fn dot_f16(x: &[f16], y: &[f32]) -> f32 {
    assert_eq!(x.len(), y.len());
    let n = x.len();
    let (xp, yp) = (x.as_ptr(), y.as_ptr());
    let (mut acc0, mut acc1) = (f32x4_splat(0.0), f32x4_splat(0.0));
    let mut i = 0;
    // SAFETY: every 4-lane load covers lanes below n.
    unsafe {
        while i + 8 <= n {
            let y0 = v128_load(yp.add(i) as *const v128);
            let y1 = v128_load(yp.add(i + 4) as *const v128);
            acc0 = f32x4_add(acc0, f32x4_mul(f16::load4(xp.add(i)), y0));
            acc1 = f32x4_add(acc1, f32x4_mul(f16::load4(xp.add(i + 4)), y1));
            i += 8;
        }
        if i + 4 <= n {
            let y0 = v128_load(yp.add(i) as *const v128);
            acc0 = f32x4_add(acc0, f32x4_mul(f16::load4(xp.add(i)), y0));
            i += 4;
        }
    }
    let mut sum = hsum(f32x4_add(acc0, acc1));
    for j in i..n {
        sum += x[j].to_f32() * y[j];
    }
    sum
}

/// # Safety
/// `x.len() == y.len()`.
pub unsafe fn axpy_f16(a: f32, x: &[f16], y: &mut [f32]) {
    assert_eq!(x.len(), y.len());
    let n = x.len();
    let (xp, yp) = (x.as_ptr(), y.as_mut_ptr());
    let va = f32x4_splat(a);
    let mut i = 0;
    // SAFETY: i + 4 <= n for both slices.
    unsafe {
        while i + 4 <= n {
            let yv = v128_load(yp.add(i) as *const v128);
            let v = f32x4_add(yv, f32x4_mul(va, f16::load4(xp.add(i))));
            v128_store(yp.add(i) as *mut v128, v);
            i += 4;
        }
    }
    for j in i..n {
        y[j] += a * x[j].to_f32();
    }
}
