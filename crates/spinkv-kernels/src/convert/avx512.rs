//! AVX-512 bulk conversions, 16 lanes per instruction, masked tails.

use crate::simd::avx512::tail_mask;
use half::f16;
use std::arch::x86_64::*;

/// # Safety
/// CPU must support AVX-512 F/BW/VL (+AVX2/FMA/F16C); `src.len() == dst.len()`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
pub unsafe fn f32_to_f16(src: &[f32], dst: &mut [f16]) {
    assert_eq!(src.len(), dst.len());
    let n = src.len();
    let (sp, dp) = (src.as_ptr(), dst.as_mut_ptr() as *mut __m256i);
    let mut i = 0;
    // SAFETY: full accesses stay below n; masked ones touch only lanes below n.
    unsafe {
        while i + 16 <= n {
            let h = _mm512_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm512_loadu_ps(sp.add(i)));
            _mm256_storeu_si256((dp as *mut i16).add(i) as *mut __m256i, h);
            i += 16;
        }
        if i < n {
            let m = tail_mask(n - i);
            let h =
                _mm512_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm512_maskz_loadu_ps(m, sp.add(i)));
            _mm256_mask_storeu_epi16((dp as *mut i16).add(i), m, h);
        }
    }
}

/// # Safety
/// CPU must support AVX-512 F/BW/VL (+AVX2/FMA/F16C); `src.len() == dst.len()`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
pub unsafe fn f16_to_f32(src: &[f16], dst: &mut [f32]) {
    assert_eq!(src.len(), dst.len());
    let n = src.len();
    let (sp, dp) = (src.as_ptr() as *const i16, dst.as_mut_ptr());
    let mut i = 0;
    // SAFETY: full accesses stay below n; masked ones touch only lanes below n.
    unsafe {
        while i + 16 <= n {
            let h = _mm256_loadu_si256(sp.add(i) as *const __m256i);
            _mm512_storeu_ps(dp.add(i), _mm512_cvtph_ps(h));
            i += 16;
        }
        if i < n {
            let m = tail_mask(n - i);
            let h = _mm256_maskz_loadu_epi16(m, sp.add(i));
            _mm512_mask_storeu_ps(dp.add(i), m, _mm512_cvtph_ps(h));
        }
    }
}
