//! AVX2 scale decoding, 8 tokens at a time (no FMA: the polynomial rounds as the scalar one).

use super::{EXP2_MAX, EXP2_MIN, EXP2_P};
use std::arch::x86_64::*;

/// # Safety
/// CPU must support AVX2+FMA+F16C; equal lengths.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn decode_log_u8(codes: &[u8], lo: f32, step: f32, out: &mut [f32]) {
    let n = codes.len();
    let (vlo, vstep) = (_mm256_set1_ps(lo), _mm256_set1_ps(step));
    let mut i = 0;
    while i + 8 <= n {
        // SAFETY: i + 8 <= n for both slices.
        unsafe {
            let c = _mm256_cvtepu8_epi32(_mm_loadl_epi64(codes.as_ptr().add(i) as *const __m128i));
            let cm1 = _mm256_cvtepi32_ps(_mm256_sub_epi32(c, _mm256_set1_epi32(1)));
            let v = exp2(_mm256_add_ps(vlo, _mm256_mul_ps(cm1, vstep)));
            let zero = _mm256_castsi256_ps(_mm256_cmpeq_epi32(c, _mm256_setzero_si256()));
            _mm256_storeu_ps(out.as_mut_ptr().add(i), _mm256_andnot_ps(zero, v));
        }
        i += 8;
    }
    super::scalar::decode_log_u8(&codes[i..], lo, step, &mut out[i..]);
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn exp2(x: __m256) -> __m256 {
    let x = _mm256_min_ps(
        _mm256_max_ps(x, _mm256_set1_ps(EXP2_MIN)),
        _mm256_set1_ps(EXP2_MAX),
    );
    let n = _mm256_floor_ps(_mm256_add_ps(x, _mm256_set1_ps(0.5)));
    let r = _mm256_sub_ps(x, n);
    let mut p = _mm256_set1_ps(EXP2_P[0]);
    for &c in &EXP2_P[1..] {
        p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(c));
    }
    let two_r = _mm256_add_ps(_mm256_set1_ps(1.0), _mm256_mul_ps(r, p));
    let two_n = _mm256_slli_epi32::<23>(_mm256_add_epi32(
        _mm256_cvttps_epi32(n),
        _mm256_set1_epi32(127),
    ));
    _mm256_mul_ps(two_r, _mm256_castsi256_ps(two_n))
}

/// # Safety
/// CPU must support AVX2+FMA+F16C; `out` as long as the runs together.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn decode_log_u8_runs(runs: &[super::LogRun<'_>], out: &mut [f32]) {
    super::decode_runs!(runs, out);
}
