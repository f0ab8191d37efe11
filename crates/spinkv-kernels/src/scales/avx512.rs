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
            let nonzero = _mm512_test_epi32_mask(c, c);
            let v = exp2(nonzero, _mm512_add_ps(vlo, _mm512_mul_ps(cm1, vstep)));
            _mm512_mask_storeu_ps(out.as_mut_ptr().add(i), m, v);
        }
        i += 16;
    }
}

/// `exp2` of the lanes in `keep`, 0 in the others.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
fn exp2(keep: __mmask16, x: __m512) -> __m512 {
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
    // `two_r · 2^n` in one instruction: n is an integer in [-126, 127] after the clamp, so 2^n
    // is a normal float and this is the one rounding of the product the other ISAs take with
    // 2^n built from its exponent bits.
    _mm512_maskz_scalef_ps(keep, two_r, n)
}

/// # Safety
/// CPU must support AVX-512 F/BW/VL (+AVX2/FMA/F16C); `out` as long as the runs together.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
pub unsafe fn decode_log_u8_runs(runs: &[super::LogRun<'_>], out: &mut [f32]) {
    super::decode_runs!(runs, out);
}
