//! AVX-512 mixed f16/f32 dot / axpy: halves widen in registers (vcvtph2ps), masked tails.

use crate::simd::avx512::{dot16, tail_mask, Lanes};
use half::f16;
use std::arch::x86_64::*;

/// # Safety
/// CPU must support AVX-512 F/BW/VL (+AVX2/FMA/F16C); `x.len() == y.len()`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
pub unsafe fn dot_f16(x: &[f16], y: &[f32]) -> f32 {
    assert_eq!(x.len(), y.len());
    // SAFETY: both slices hold x.len() elements.
    unsafe { dot16(x.as_ptr(), y.as_ptr(), x.len()) }
}

/// # Safety
/// CPU must support AVX-512 F/BW/VL (+AVX2/FMA/F16C); `x.len() == y.len()`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
pub unsafe fn axpy_f16(a: f32, x: &[f16], y: &mut [f32]) {
    assert_eq!(x.len(), y.len());
    let n = x.len();
    let va = _mm512_set1_ps(a);
    let (xp, yp) = (x.as_ptr(), y.as_mut_ptr());
    let mut i = 0;
    // SAFETY: full accesses stay below n; masked ones touch only lanes below n.
    unsafe {
        while i + 16 <= n {
            let v = _mm512_fmadd_ps(va, f16::load16(xp.add(i)), _mm512_loadu_ps(yp.add(i)));
            _mm512_storeu_ps(yp.add(i), v);
            i += 16;
        }
        if i < n {
            let m = tail_mask(n - i);
            let v = _mm512_fmadd_ps(
                va,
                f16::load16_masked(xp.add(i), m),
                _mm512_maskz_loadu_ps(m, yp.add(i)),
            );
            _mm512_mask_storeu_ps(yp.add(i), m, v);
        }
    }
}
