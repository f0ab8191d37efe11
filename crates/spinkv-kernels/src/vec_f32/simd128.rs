//! WASM SIMD128 f32 dot / axpy.

use crate::simd::simd128::hsum;
use core::arch::wasm32::*;

/// # Safety
/// `x.len() == y.len()` (simd128 is a compile-time feature of the module).
pub unsafe fn dot_f32(x: &[f32], y: &[f32]) -> f32 {
    assert_eq!(x.len(), y.len());
    let n = x.len();
    let (xp, yp) = (x.as_ptr(), y.as_ptr());
    let mut acc = [f32x4_splat(0.0); 4];
    let mut i = 0;
    // SAFETY: every 4-lane load covers i..i+4 <= n (or i..i+16 <= n).
    unsafe {
        while i + 16 <= n {
            for (j, acc) in acc.iter_mut().enumerate() {
                let xv = v128_load(xp.add(i + 4 * j) as *const v128);
                let yv = v128_load(yp.add(i + 4 * j) as *const v128);
                *acc = f32x4_add(*acc, f32x4_mul(xv, yv));
            }
            i += 16;
        }
        while i + 4 <= n {
            let xv = v128_load(xp.add(i) as *const v128);
            let yv = v128_load(yp.add(i) as *const v128);
            acc[0] = f32x4_add(acc[0], f32x4_mul(xv, yv));
            i += 4;
        }
    }
    let mut sum = hsum(f32x4_add(
        f32x4_add(acc[0], acc[1]),
        f32x4_add(acc[2], acc[3]),
    ));
    for j in i..n {
        sum += x[j] * y[j];
    }
    sum
}

/// # Safety
/// `x.len() == y.len()`.
pub unsafe fn axpy_f32(a: f32, x: &[f32], y: &mut [f32]) {
    assert_eq!(x.len(), y.len());
    let n = x.len();
    let (xp, yp) = (x.as_ptr(), y.as_mut_ptr());
    let va = f32x4_splat(a);
    let mut i = 0;
    // SAFETY: i + 4 <= n for both slices.
    unsafe {
        while i + 4 <= n {
            let yv = v128_load(yp.add(i) as *const v128);
            let xv = v128_load(xp.add(i) as *const v128);
            v128_store(yp.add(i) as *mut v128, f32x4_add(yv, f32x4_mul(va, xv)));
            i += 4;
        }
    }
    for j in i..n {
        y[j] += a * x[j];
    }
}

/// # Safety
/// None beyond the slice.
pub unsafe fn scale_f32(x: &mut [f32], a: f32) {
    let n = x.len();
    let p = x.as_mut_ptr();
    let va = f32x4_splat(a);
    let mut i = 0;
    while i + 4 <= n {
        // SAFETY: i + 4 <= n.
        unsafe {
            let v = f32x4_mul(v128_load(p.add(i) as *const v128), va);
            v128_store(p.add(i) as *mut v128, v);
        }
        i += 4;
    }
    for v in &mut x[i..] {
        *v *= a;
    }
}

/// # Safety
/// `x.len() == y.len()`.
pub unsafe fn mul_f32(x: &mut [f32], y: &[f32]) {
    assert_eq!(x.len(), y.len());
    let n = x.len();
    let (xp, yp) = (x.as_mut_ptr(), y.as_ptr());
    let mut i = 0;
    while i + 4 <= n {
        // SAFETY: i + 4 <= n for both slices.
        unsafe {
            let v = f32x4_mul(
                v128_load(xp.add(i) as *const v128),
                v128_load(yp.add(i) as *const v128),
            );
            v128_store(xp.add(i) as *mut v128, v);
        }
        i += 4;
    }
    for j in i..n {
        x[j] *= y[j];
    }
}
