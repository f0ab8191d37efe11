//! Small AVX2 building blocks shared by the per-op `avx2.rs` files.

use half::{bf16, f16};
use std::arch::x86_64::*;

/// Max of the 8 lanes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn hmax(v: __m256) -> f32 {
    let lo = _mm256_castps256_ps128(v);
    let hi = _mm256_extractf128_ps::<1>(v);
    let m = _mm_max_ps(lo, hi);
    let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    let m = _mm_max_ss(m, _mm_movehdup_ps(m));
    _mm_cvtss_f32(m)
}

/// 8 f32.
///
/// # Safety
/// `ptr` valid for 8 elements; AVX2+FMA+F16C.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn load8_f32(ptr: *const f32) -> __m256 {
    // SAFETY: as the caller guarantees.
    unsafe { _mm256_loadu_ps(ptr) }
}

/// 8 halves widened to f32.
///
/// # Safety
/// As [`load8_f32`].
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn load8_f16(ptr: *const f16) -> __m256 {
    // SAFETY: as the caller guarantees (16 bytes).
    unsafe { _mm256_cvtph_ps(_mm_loadu_si128(ptr as *const __m128i)) }
}

/// 8 bf16 widened to f32.
///
/// # Safety
/// As [`load8_f32`].
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn load8_bf16(ptr: *const bf16) -> __m256 {
    // bf16 is the top half of an f32: zero-extend to 32 bits and shift into place.
    // SAFETY: as the caller guarantees (16 bytes).
    let raw = unsafe { _mm256_cvtepu16_epi32(_mm_loadu_si128(ptr as *const __m128i)) };
    _mm256_castsi256_ps(_mm256_slli_epi32::<16>(raw))
}

/// 8 signed bytes widened to f32 (exactly: |v| <= 128).
///
/// # Safety
/// As [`load8_f32`].
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn load8_i8(ptr: *const i8) -> __m256 {
    // SAFETY: as the caller guarantees (8 bytes).
    let raw = unsafe { _mm_loadl_epi64(ptr as *const __m128i) };
    _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(raw))
}

/// e^x for 8 lanes; inputs below -87.3 flush to 0 (including -inf), so masked scores vanish.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn exp(x: __m256) -> __m256 {
    use super::exp_consts::P;
    exp_with(x, &P)
}

/// e^x as [`exp`] with the shorter polynomial softmax weights take (`exp_consts::P_SOFTMAX`).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn exp_softmax(x: __m256) -> __m256 {
    use super::exp_consts::P_SOFTMAX;
    exp_with(x, &P_SOFTMAX)
}

/// e^x with the polynomial `p` (highest degree first): every ISA's range reduction and
/// rounding steps.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn exp_with(x: __m256, p: &[f32]) -> __m256 {
    use super::exp_consts::*;
    let underflow = _mm256_cmp_ps::<_CMP_LT_OQ>(x, _mm256_set1_ps(LOW));
    let x = _mm256_min_ps(x, _mm256_set1_ps(HIGH));
    let x = _mm256_max_ps(x, _mm256_set1_ps(LOW));
    // x = n·ln2 + r with |r| <= ln2/2, ln2 split in two for precision.
    let n = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(_mm256_mul_ps(
        x,
        _mm256_set1_ps(std::f32::consts::LOG2_E),
    ));
    let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(LN2_HI), x);
    let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(LN2_LO), r);
    let mut poly = _mm256_set1_ps(p[0]);
    for &c in &p[1..] {
        poly = _mm256_fmadd_ps(poly, r, _mm256_set1_ps(c));
    }
    let r2 = _mm256_mul_ps(r, r);
    let er = _mm256_add_ps(_mm256_fmadd_ps(poly, r2, r), _mm256_set1_ps(1.0));
    let two_n = _mm256_castsi256_ps(_mm256_slli_epi32::<23>(_mm256_add_epi32(
        _mm256_cvtps_epi32(n),
        _mm256_set1_epi32(127),
    )));
    _mm256_andnot_ps(underflow, _mm256_mul_ps(er, two_n))
}

/// Mask of the first `n` (<= 8) lanes, for `_mm256_maskload_ps` / `_mm256_maskstore_ps`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn tail_mask(n: usize) -> __m256i {
    let lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    _mm256_cmpgt_epi32(_mm256_set1_epi32(n as i32), lanes)
}

/// Per 128-bit half: lane 0 (and 4) = `(x0 + x2) + (x1 + x3)` of that quad.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn quad_sums(v: __m256) -> __m256 {
    let t = _mm256_add_ps(v, _mm256_permute_ps::<0b01_00_11_10>(v));
    _mm256_add_ps(t, _mm256_permute_ps::<0b10_11_00_01>(t))
}

/// The canonical reduction of 16 lanes held as `lo` (lanes 0..8) and `hi` (8..16).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn reduce16(lo: __m256, hi: __m256) -> f32 {
    let (a, b) = (quad_sums(lo), quad_sums(hi));
    let q01 = _mm_add_ss(_mm256_castps256_ps128(a), _mm256_extractf128_ps::<1>(a));
    let q23 = _mm_add_ss(_mm256_castps256_ps128(b), _mm256_extractf128_ps::<1>(b));
    _mm_cvtss_f32(_mm_add_ss(q01, q23))
}
