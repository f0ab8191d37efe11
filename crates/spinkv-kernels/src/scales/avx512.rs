//! AVX-512 scale decoding, 16 tokens at a time with a masked tail (no FMA).

use super::{EXP2_MAX, EXP2_MIN, EXP2_P};
use crate::simd::avx512::tail_mask;
use std::arch::x86_64::*;

/// # Safety
/// CPU must support AVX-512 F/BW/VL (+AVX2/FMA/F16C); equal lengths.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
pub unsafe fn decode_log_u8(codes: &[u8], lo: f32, step: f32, out: &mut [f32]) {
    let n = codes.len();
    let (vlo, vstep) = (_mm512_set1_ps(lo), _mm512_set1_ps(step));
    let mut i = 0;
    while i < n {
        let m = tail_mask((n - i).min(16));
        // SAFETY: masked lanes stay below n for both slices.
        unsafe {
            let raw = _mm_maskz_loadu_epi8(m, codes.as_ptr().add(i) as *const i8);
            let c = _mm512_cvtepu8_epi32(raw);
            let cm1 = _mm512_cvtepi32_ps(_mm512_sub_epi32(c, _mm512_set1_epi32(1)));
            let v = exp2(_mm512_add_ps(vlo, _mm512_mul_ps(cm1, vstep)));
            let nonzero = _mm512_test_epi32_mask(c, c);
            _mm512_mask_storeu_ps(out.as_mut_ptr().add(i), m, _mm512_maskz_mov_ps(nonzero, v));
        }
        i += 16;
    }
}

#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
fn exp2(x: __m512) -> __m512 {
    let x = _mm512_min_ps(
        _mm512_max_ps(x, _mm512_set1_ps(EXP2_MIN)),
        _mm512_set1_ps(EXP2_MAX),
    );
    let n = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC }>(_mm512_add_ps(
        x,
        _mm512_set1_ps(0.5),
    ));
    let r = _mm512_sub_ps(x, n);
    let mut p = _mm512_set1_ps(EXP2_P[0]);
    for &c in &EXP2_P[1..] {
        p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(c));
    }
    let two_r = _mm512_add_ps(_mm512_set1_ps(1.0), _mm512_mul_ps(r, p));
    let two_n = _mm512_slli_epi32::<23>(_mm512_add_epi32(
        _mm512_cvttps_epi32(n),
        _mm512_set1_epi32(127),
    ));
    _mm512_mul_ps(two_r, _mm512_castsi512_ps(two_n))
}

/// # Safety
/// CPU must support AVX-512 F/BW/VL (+AVX2/FMA/F16C); `out` as long as the runs together.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
pub unsafe fn decode_log_u8_runs(runs: &[super::LogRun<'_>], out: &mut [f32]) {
    super::decode_runs!(runs, out);
}
