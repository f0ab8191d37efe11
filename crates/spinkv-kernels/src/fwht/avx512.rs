//! AVX-512 FWHT: the stages with `h < 16` inside each 16-lane vector (permute, add, masked
//! subtract), the others as vector butterflies across blocks. Bit-identical to scalar.

use std::arch::x86_64::*;

/// # Safety
/// CPU must support AVX-512 F/BW/VL (+AVX2/FMA/F16C); `x.len() == signs.len()`, a power of two.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
pub unsafe fn signed_fwht(x: &mut [f32], signs: &[f32]) {
    if x.len() < 16 {
        // SAFETY: AVX-512 implies AVX2.
        return unsafe { crate::fwht::avx2::signed_fwht(x, signs) };
    }
    // SAFETY: same target features; lengths checked by the caller.
    unsafe {
        crate::vec_f32::avx512::mul_f32(x, signs);
        fwht(x);
    }
}

/// # Safety
/// As [`signed_fwht`].
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
pub unsafe fn fwht_signed(x: &mut [f32], signs: &[f32]) {
    if x.len() < 16 {
        // SAFETY: AVX-512 implies AVX2.
        return unsafe { crate::fwht::avx2::fwht_signed(x, signs) };
    }
    // SAFETY: as above.
    unsafe {
        fwht(x);
        crate::vec_f32::avx512::mul_f32(x, signs);
    }
}

/// `u + v` where lane bit `h` is clear, `u - v` (= `t - x`) where it is set.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
fn stage(x: __m512, t: __m512, high: __mmask16) -> __m512 {
    _mm512_mask_sub_ps(_mm512_add_ps(x, t), high, t, x)
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
unsafe fn fwht(x: &mut [f32]) {
    let n = x.len();
    let p = x.as_mut_ptr();
    // SAFETY (all loads and stores): indices stay below n, a multiple of 16.
    unsafe {
        for i in (0..n).step_by(16) {
            let mut v = _mm512_loadu_ps(p.add(i));
            v = stage(v, _mm512_permute_ps::<0b10_11_00_01>(v), 0xAAAA);
            v = stage(v, _mm512_permute_ps::<0b01_00_11_10>(v), 0xCCCC);
            v = stage(v, _mm512_shuffle_f32x4::<0b10_11_00_01>(v, v), 0xF0F0);
            v = stage(v, _mm512_shuffle_f32x4::<0b01_00_11_10>(v, v), 0xFF00);
            _mm512_storeu_ps(p.add(i), v);
        }
        let mut h = 16;
        while h < n {
            for block in (0..n).step_by(2 * h) {
                for i in (block..block + h).step_by(16) {
                    let u = _mm512_loadu_ps(p.add(i));
                    let v = _mm512_loadu_ps(p.add(i + h));
                    _mm512_storeu_ps(p.add(i), _mm512_add_ps(u, v));
                    _mm512_storeu_ps(p.add(i + h), _mm512_sub_ps(u, v));
                }
            }
            h *= 2;
        }
        crate::vec_f32::avx512::scale_f32(x, 1.0 / (n as f32).sqrt());
    }
}
