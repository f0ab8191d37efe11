//! AVX-512 snapping, 16 channels at a time with masked tails: count thresholds below each lane
//! (masked increment), then `vpermps` / `vpermt2ps` / gather for the levels.

use super::Codebooks;
use crate::simd::avx512::tail_mask;
use std::arch::x86_64::*;

/// # Safety
/// CPU must support AVX-512 F/BW/VL (+AVX2/FMA/F16C); shapes as checked by `super::quantize`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
pub unsafe fn quantize(books: Codebooks<'_>, y: &[f32], codes: &mut [u8], recon: &mut [f32]) {
    let one = _mm512_set1_epi32(1);
    for (first, len, t, l, width) in books.runs() {
        let mut padded = [0.0f32; 32];
        let n_l = l.len().min(32);
        padded[..n_l].copy_from_slice(&l[..n_l]);
        // SAFETY: 32-element local array.
        let (t0, t1) = unsafe {
            (
                _mm512_loadu_ps(padded.as_ptr()),
                _mm512_loadu_ps(padded.as_ptr().add(16)),
            )
        };
        let mut c = first;
        while c < first + len {
            let m = tail_mask((first + len - c).min(16));
            // SAFETY: masked lanes stay inside y, recon and codes (c + n <= d).
            unsafe {
                let x = _mm512_maskz_loadu_ps(m, y.as_ptr().add(c));
                let mut count = _mm512_setzero_si512();
                for &th in t {
                    let below = _mm512_cmp_ps_mask::<_CMP_LT_OQ>(_mm512_set1_ps(th), x);
                    count = _mm512_mask_add_epi32(count, below, count, one);
                }
                let v = match width {
                    1..=4 => _mm512_permutexvar_ps(count, t0),
                    5 => _mm512_permutex2var_ps(t0, count, t1),
                    _ => _mm512_mask_i32gather_ps::<4>(_mm512_setzero_ps(), m, count, l.as_ptr()),
                };
                _mm512_mask_storeu_ps(recon.as_mut_ptr().add(c), m, v);
                _mm_mask_storeu_epi8(
                    codes.as_mut_ptr().add(c) as *mut i8,
                    m,
                    _mm512_cvtepi32_epi8(count),
                );
            }
            c += 16;
        }
    }
}
