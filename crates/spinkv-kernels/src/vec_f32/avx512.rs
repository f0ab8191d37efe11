//! AVX-512 dot (canonical 16-lane chain) / axpy of f32 or f16 rows against f32 (halves widen
//! in registers), scale, mul; tails through masked loads.

use crate::simd::avx512::{dot16, tail_mask, Lanes};
use std::arch::x86_64::*;

/// # Safety
/// CPU must support AVX-512 F/BW/VL (+AVX2/FMA/F16C); `x.len() == y.len()`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
pub unsafe fn dot<L: Lanes>(x: &[L], y: &[f32]) -> f32 {
    assert_eq!(x.len(), y.len());
    // SAFETY: both slices hold x.len() elements.
    unsafe { dot16(x.as_ptr(), y.as_ptr(), x.len()) }
}

/// # Safety
/// CPU must support AVX-512 F/BW/VL (+AVX2/FMA/F16C); `x.len() == y.len()`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
pub unsafe fn axpy<L: Lanes>(a: f32, x: &[L], y: &mut [f32]) {
    assert_eq!(x.len(), y.len());
    let n = x.len();
    let va = _mm512_set1_ps(a);
    let (xp, yp) = (x.as_ptr(), y.as_mut_ptr());
    let mut i = 0;
    // SAFETY: full accesses cover i..i+16 <= n; the masked ones only i..n.
    unsafe {
        while i + 16 <= n {
            let v = _mm512_fmadd_ps(va, L::load16(xp.add(i)), _mm512_loadu_ps(yp.add(i)));
            _mm512_storeu_ps(yp.add(i), v);
            i += 16;
        }
        if i < n {
            let m = tail_mask(n - i);
            let v = _mm512_fmadd_ps(
                va,
                L::load16_masked(xp.add(i), m),
                _mm512_maskz_loadu_ps(m, yp.add(i)),
            );
            _mm512_mask_storeu_ps(yp.add(i), m, v);
        }
    }
}

/// # Safety
/// CPU must support AVX-512 F/BW/VL (+AVX2/FMA/F16C).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
pub unsafe fn scale_f32(x: &mut [f32], a: f32) {
    let n = x.len();
    let va = _mm512_set1_ps(a);
    let p = x.as_mut_ptr();
    let mut i = 0;
    // SAFETY: full accesses stay below n; masked ones touch only lanes below n.
    unsafe {
        while i + 16 <= n {
            _mm512_storeu_ps(p.add(i), _mm512_mul_ps(_mm512_loadu_ps(p.add(i)), va));
            i += 16;
        }
        if i < n {
            let m = tail_mask(n - i);
            _mm512_mask_storeu_ps(
                p.add(i),
                m,
                _mm512_mul_ps(_mm512_maskz_loadu_ps(m, p.add(i)), va),
            );
        }
    }
}

/// # Safety
/// CPU must support AVX-512 F/BW/VL (+AVX2/FMA/F16C); `x.len() == y.len()`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
pub unsafe fn mul_f32(x: &mut [f32], y: &[f32]) {
    assert_eq!(x.len(), y.len());
    let n = x.len();
    let (xp, yp) = (x.as_mut_ptr(), y.as_ptr());
    let mut i = 0;
    // SAFETY: masked lanes stay below n for both slices.
    unsafe {
        while i < n {
            let m = tail_mask((n - i).min(16));
            let v = _mm512_mul_ps(
                _mm512_maskz_loadu_ps(m, xp.add(i)),
                _mm512_maskz_loadu_ps(m, yp.add(i)),
            );
            _mm512_mask_storeu_ps(xp.add(i), m, v);
            i += 16;
        }
    }
}
