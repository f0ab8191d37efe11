//! AVX2/F16C mixed f16/f32 dot / axpy: f16 lanes widen in registers (vcvtph2ps).

use crate::simd::avx2::{hsum, Lanes};
use half::f16;
use std::arch::x86_64::*;

/// # Safety
/// CPU must support AVX2+FMA+F16C; `x.len() == y.len()`.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn dot_f16(x: &[f16], y: &[f32]) -> f32 {
    assert_eq!(x.len(), y.len());
    let n = x.len();
    let (mut acc0, mut acc1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
    let mut i = 0;
    // SAFETY: loads read lanes i..i+16 (or i..i+8) with that bound <= n for both slices.
    unsafe {
        while i + 16 <= n {
            let xa = f16::load8(x.as_ptr().add(i));
            let xb = f16::load8(x.as_ptr().add(i + 8));
            acc0 = _mm256_fmadd_ps(xa, _mm256_loadu_ps(y.as_ptr().add(i)), acc0);
            acc1 = _mm256_fmadd_ps(xb, _mm256_loadu_ps(y.as_ptr().add(i + 8)), acc1);
            i += 16;
        }
        if i + 8 <= n {
            let xa = f16::load8(x.as_ptr().add(i));
            acc0 = _mm256_fmadd_ps(xa, _mm256_loadu_ps(y.as_ptr().add(i)), acc0);
            i += 8;
        }
    }
    let mut sum = hsum(_mm256_add_ps(acc0, acc1));
    for j in i..n {
        sum += x[j].to_f32() * y[j];
    }
    sum
}

/// # Safety
/// CPU must support AVX2+FMA+F16C; `x.len() == y.len()`.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn axpy_f16(a: f32, x: &[f16], y: &mut [f32]) {
    assert_eq!(x.len(), y.len());
    let n = x.len();
    let va = _mm256_set1_ps(a);
    let mut i = 0;
    while i + 8 <= n {
        // SAFETY: i + 8 <= n for both slices.
        unsafe {
            let yp = y.as_mut_ptr().add(i);
            let xv = f16::load8(x.as_ptr().add(i));
            _mm256_storeu_ps(yp, _mm256_fmadd_ps(va, xv, _mm256_loadu_ps(yp)));
        }
        i += 8;
    }
    for j in i..n {
        y[j] += a * x[j].to_f32();
    }
}
