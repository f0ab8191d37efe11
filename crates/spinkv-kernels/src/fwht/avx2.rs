//! AVX2 FWHT: the stages with `h < 8` inside each 8-lane vector (permute, add, subtract,
//! blend), the others as vector butterflies across blocks. Bit-identical to scalar.

use std::arch::x86_64::*;

/// # Safety
/// CPU must support AVX2+FMA+F16C; `x.len() == signs.len()`, a power of two.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn signed_fwht(x: &mut [f32], signs: &[f32]) {
    if x.len() < 8 {
        return super::scalar::signed_fwht(x, signs);
    }
    // SAFETY: same target features; lengths checked by the caller.
    unsafe {
        crate::vec_f32::avx2::mul_f32(x, signs);
        fwht(x);
    }
}

/// # Safety
/// As [`signed_fwht`].
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn fwht_signed(x: &mut [f32], signs: &[f32]) {
    if x.len() < 8 {
        return super::scalar::fwht_signed(x, signs);
    }
    // SAFETY: as above.
    unsafe {
        fwht(x);
        crate::vec_f32::avx2::mul_f32(x, signs);
    }
}

/// `u + v` where lane bit `h` is clear, `u - v` where it is set (`t` = `x` with partners
/// swapped, so `u`/`v` are `x`/`t` or `t`/`x`).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn stage<const MASK: i32>(x: __m256, t: __m256) -> __m256 {
    _mm256_blend_ps::<MASK>(_mm256_add_ps(x, t), _mm256_sub_ps(t, x))
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn fwht(x: &mut [f32]) {
    let n = x.len();
    let p = x.as_mut_ptr();
    // SAFETY (all loads and stores): indices stay below n, a multiple of 8.
    unsafe {
        for i in (0..n).step_by(8) {
            let mut v = _mm256_loadu_ps(p.add(i));
            v = stage::<0b1010_1010>(v, _mm256_permute_ps::<0b10_11_00_01>(v));
            v = stage::<0b1100_1100>(v, _mm256_permute_ps::<0b01_00_11_10>(v));
            v = stage::<0b1111_0000>(v, _mm256_permute2f128_ps::<1>(v, v));
            _mm256_storeu_ps(p.add(i), v);
        }
        let mut h = 8;
        while h < n {
            for block in (0..n).step_by(2 * h) {
                for i in (block..block + h).step_by(8) {
                    let u = _mm256_loadu_ps(p.add(i));
                    let v = _mm256_loadu_ps(p.add(i + h));
                    _mm256_storeu_ps(p.add(i), _mm256_add_ps(u, v));
                    _mm256_storeu_ps(p.add(i + h), _mm256_sub_ps(u, v));
                }
            }
            h *= 2;
        }
        crate::vec_f32::avx2::scale_f32(x, 1.0 / (n as f32).sqrt());
    }
}
