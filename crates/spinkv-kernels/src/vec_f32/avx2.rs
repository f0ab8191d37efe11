//! AVX2 dot / axpy of f32 or f16 rows against f32 (f16 lanes widen in registers,
//! vcvtph2ps), scale, mul.

use crate::simd::avx2::{dot16, Lanes};
use std::arch::x86_64::*;

/// # Safety
/// CPU must support AVX2+FMA+F16C; `x.len() == y.len()`.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn dot<L: Lanes>(x: &[L], y: &[f32]) -> f32 {
    assert_eq!(x.len(), y.len());
    // SAFETY: both slices hold x.len() elements.
    unsafe { dot16(x.as_ptr(), y.as_ptr(), x.len()) }
}

/// # Safety
/// CPU must support AVX2+FMA+F16C; `x.len() == y.len()`.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn axpy<L: Lanes>(a: f32, x: &[L], y: &mut [f32]) {
    assert_eq!(x.len(), y.len());
    let n = x.len();
    let va = _mm256_set1_ps(a);
    let mut i = 0;
    while i + 8 <= n {
        // SAFETY: i + 8 <= n for both slices.
        unsafe {
            let yp = y.as_mut_ptr().add(i);
            let xv = L::load8(x.as_ptr().add(i));
            _mm256_storeu_ps(yp, _mm256_fmadd_ps(va, xv, _mm256_loadu_ps(yp)));
        }
        i += 8;
    }
    for j in i..n {
        y[j] = a.mul_add(x[j].widen(), y[j]);
    }
}

/// # Safety
/// CPU must support AVX2+FMA+F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn scale_f32(x: &mut [f32], a: f32) {
    let n = x.len();
    let va = _mm256_set1_ps(a);
    let p = x.as_mut_ptr();
    let mut i = 0;
    while i + 8 <= n {
        // SAFETY: i + 8 <= n.
        unsafe { _mm256_storeu_ps(p.add(i), _mm256_mul_ps(_mm256_loadu_ps(p.add(i)), va)) };
        i += 8;
    }
    for v in &mut x[i..] {
        *v *= a;
    }
}

/// # Safety
/// CPU must support AVX2+FMA+F16C; `x.len() == y.len()`.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn mul_f32(x: &mut [f32], y: &[f32]) {
    assert_eq!(x.len(), y.len());
    let n = x.len();
    let (xp, yp) = (x.as_mut_ptr(), y.as_ptr());
    let mut i = 0;
    while i + 8 <= n {
        // SAFETY: i + 8 <= n for both slices.
        unsafe {
            let v = _mm256_mul_ps(_mm256_loadu_ps(xp.add(i)), _mm256_loadu_ps(yp.add(i)));
            _mm256_storeu_ps(xp.add(i), v);
        }
        i += 8;
    }
    for j in i..n {
        x[j] *= y[j];
    }
}
