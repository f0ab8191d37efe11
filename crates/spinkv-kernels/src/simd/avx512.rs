//! Small AVX-512 (F + BW + VL, with AVX2/FMA/F16C) building blocks shared by the per-op
//! `avx512.rs` files. Tails use masked loads and stores instead of scalar epilogues.

pub(crate) use super::Lanes;
use half::{bf16, f16};
use std::arch::x86_64::*;

/// Mask of the first `n` lanes (`n <= 16`).
#[inline(always)]
pub(crate) fn tail_mask(n: usize) -> __mmask16 {
    debug_assert!(n <= 16);
    ((1u32 << n) - 1) as __mmask16
}

/// Max of the 16 lanes.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
pub(crate) fn hmax(v: __m512) -> f32 {
    _mm512_reduce_max_ps(v)
}

/// 16 f32.
///
/// # Safety
/// `ptr` valid for 16 elements; AVX-512 F/BW/VL present.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
pub(crate) unsafe fn load16_f32(ptr: *const f32) -> __m512 {
    // SAFETY: caller guarantees 16 readable lanes.
    unsafe { _mm512_loadu_ps(ptr) }
}

/// The lanes of `mask` (others 0, untouched in memory).
///
/// # Safety
/// `ptr` valid for the lanes in `mask`; AVX-512 F/BW/VL present.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
pub(crate) unsafe fn load16_masked_f32(ptr: *const f32, mask: __mmask16) -> __m512 {
    // SAFETY: masked-off lanes are not accessed.
    unsafe { _mm512_maskz_loadu_ps(mask, ptr) }
}

/// 16 halves widened to f32.
///
/// # Safety
/// As [`load16_f32`].
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
pub(crate) unsafe fn load16_f16(ptr: *const f16) -> __m512 {
    // SAFETY: caller guarantees 16 readable halves (32 bytes).
    unsafe { _mm512_cvtph_ps(_mm256_loadu_si256(ptr as *const __m256i)) }
}

/// As [`load16_masked_f32`], for halves.
///
/// # Safety
/// As [`load16_masked_f32`].
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
pub(crate) unsafe fn load16_masked_f16(ptr: *const f16, mask: __mmask16) -> __m512 {
    // SAFETY: masked-off lanes are not accessed (AVX512BW+VL masked 16-bit load).
    unsafe { _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mask, ptr as *const i16)) }
}

/// 16 bf16 widened to f32.
///
/// # Safety
/// As [`load16_f32`].
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
pub(crate) unsafe fn load16_bf16(ptr: *const bf16) -> __m512 {
    // SAFETY: caller guarantees 16 readable bf16 (32 bytes).
    let raw = unsafe { _mm512_cvtepu16_epi32(_mm256_loadu_si256(ptr as *const __m256i)) };
    _mm512_castsi512_ps(_mm512_slli_epi32::<16>(raw))
}

/// 16 signed bytes widened to f32 (exactly).
///
/// # Safety
/// As [`load16_f32`].
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
pub(crate) unsafe fn load16_i8(ptr: *const i8) -> __m512 {
    // SAFETY: caller guarantees 16 readable bytes.
    let raw = unsafe { _mm_loadu_si128(ptr as *const __m128i) };
    _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(raw))
}

/// As [`load16_masked_f32`], for signed bytes.
///
/// # Safety
/// As [`load16_masked_f32`].
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
pub(crate) unsafe fn load16_masked_i8(ptr: *const i8, mask: __mmask16) -> __m512 {
    // SAFETY: masked-off lanes are not accessed (AVX512BW+VL masked byte load).
    let raw = unsafe { _mm_maskz_loadu_epi8(mask, ptr) };
    _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(raw))
}

/// As [`load16_masked_f32`], for bf16.
///
/// # Safety
/// As [`load16_masked_f32`].
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
pub(crate) unsafe fn load16_masked_bf16(ptr: *const bf16, mask: __mmask16) -> __m512 {
    // SAFETY: masked-off lanes are not accessed.
    let raw = unsafe { _mm256_maskz_loadu_epi16(mask, ptr as *const i16) };
    _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(raw)))
}

/// e^x for 16 lanes, the same polynomial and rounding steps as the AVX2 version.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
pub(crate) fn exp(x: __m512) -> __m512 {
    use super::exp_consts::P;
    exp_with(x, &P)
}

/// e^x as [`exp`] with the shorter polynomial softmax weights take (`exp_consts::P_SOFTMAX`).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
pub(crate) fn exp_softmax(x: __m512) -> __m512 {
    use super::exp_consts::P_SOFTMAX;
    exp_with(x, &P_SOFTMAX)
}

/// e^x with the polynomial `p` (highest degree first): every ISA's range reduction and
/// rounding steps.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
fn exp_with(x: __m512, p: &[f32]) -> __m512 {
    use super::exp_consts::*;
    let keep = _mm512_cmp_ps_mask::<_CMP_NLT_UQ>(x, _mm512_set1_ps(LOW));
    let x = _mm512_min_ps(x, _mm512_set1_ps(HIGH));
    let x = _mm512_max_ps(x, _mm512_set1_ps(LOW));
    let n = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
        _mm512_mul_ps(x, _mm512_set1_ps(std::f32::consts::LOG2_E)),
    );
    let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(LN2_HI), x);
    let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(LN2_LO), r);
    let mut poly = _mm512_set1_ps(p[0]);
    for &c in &p[1..] {
        poly = _mm512_fmadd_ps(poly, r, _mm512_set1_ps(c));
    }
    let r2 = _mm512_mul_ps(r, r);
    let er = _mm512_add_ps(_mm512_fmadd_ps(poly, r2, r), _mm512_set1_ps(1.0));
    // `er · 2^n` in one instruction: n is an integer in [-126, 127] after the clamps, so 2^n
    // is a normal float and this is the one rounding of the same product the other ISAs take
    // (`er · 2^n` built from the exponent bits), three instructions fewer (B/A 1.004–1.005 of
    // `attend_bench turbo 7680`, one thread, AMD EPYC Zen 4).
    _mm512_maskz_scalef_ps(keep, er, n)
}

/// The canonical reduction of 16 lanes (`crate::canon::reduce16`).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
pub(crate) fn reduce16(v: __m512) -> f32 {
    // Per quad: (x0 + x2, x1 + x3), then their sum in lane 0.
    let t = _mm512_add_ps(v, _mm512_permute_ps::<0b01_00_11_10>(v));
    let t = _mm512_add_ps(t, _mm512_permute_ps::<0b10_11_00_01>(t));
    let q0 = _mm512_castps512_ps128(t);
    let q1 = _mm512_extractf32x4_ps::<1>(t);
    let q2 = _mm512_extractf32x4_ps::<2>(t);
    let q3 = _mm512_extractf32x4_ps::<3>(t);
    _mm_cvtss_f32(_mm_add_ss(_mm_add_ss(q0, q1), _mm_add_ss(q2, q3)))
}
