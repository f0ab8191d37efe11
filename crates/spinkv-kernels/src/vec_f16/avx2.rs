//! AVX2/F16C mixed f16/f32 dot / axpy: f16 lanes widen in registers (vcvtph2ps).

use crate::simd::avx2::{dot16, Lanes};
use half::f16;
use std::arch::x86_64::*;

/// # Safety
/// CPU must support AVX2+FMA+F16C; `x.len() == y.len()`.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn dot_f16(x: &[f16], y: &[f32]) -> f32 {
    assert_eq!(x.len(), y.len());
    // SAFETY: both slices hold x.len() elements.
    unsafe { dot16(x.as_ptr(), y.as_ptr(), x.len()) }
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
        y[j] = a.mul_add(x[j].to_f32(), y[j]);
    }
}
