//! AVX-512 softmax pieces: the shared polynomial exp on 16 lanes, masked tails.

use crate::simd::avx512::{exp, hmax, reduce16, tail_mask};
use std::arch::x86_64::*;

/// # Safety
/// CPU must support AVX-512 F/BW/VL (+AVX2/FMA/F16C).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
pub unsafe fn max_f32(x: &[f32]) -> f32 {
    let n = x.len();
    let p = x.as_ptr();
    let mut vmax = _mm512_set1_ps(f32::NEG_INFINITY);
    let mut i = 0;
    // SAFETY: full loads stay below n; the masked load touches only lanes below n.
    unsafe {
        while i + 16 <= n {
            vmax = _mm512_max_ps(vmax, _mm512_loadu_ps(p.add(i)));
            i += 16;
        }
        if i < n {
            let m = tail_mask(n - i);
            vmax = _mm512_mask_max_ps(vmax, m, vmax, _mm512_maskz_loadu_ps(m, p.add(i)));
        }
    }
    hmax(vmax)
}

/// # Safety
/// CPU must support AVX-512 F/BW/VL (+AVX2/FMA/F16C).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
pub unsafe fn exp_sub_sum(x: &mut [f32], m: f32) -> f32 {
    let n = x.len();
    let p = x.as_mut_ptr();
    let vm = _mm512_set1_ps(m);
    let mut vsum = _mm512_setzero_ps();
    let mut i = 0;
    // SAFETY: full accesses stay below n; masked ones touch only lanes below n.
    unsafe {
        while i + 16 <= n {
            let e = exp(_mm512_sub_ps(_mm512_loadu_ps(p.add(i)), vm));
            _mm512_storeu_ps(p.add(i), e);
            vsum = _mm512_add_ps(vsum, e);
            i += 16;
        }
        if i < n {
            let mask = tail_mask(n - i);
            let e = exp(_mm512_sub_ps(_mm512_maskz_loadu_ps(mask, p.add(i)), vm));
            _mm512_mask_storeu_ps(p.add(i), mask, e);
            vsum = _mm512_mask_add_ps(vsum, mask, vsum, e);
        }
    }
    reduce16(vsum)
}
