//! AVX2 snapping, 8 channels at a time: count thresholds below each lane (compare + subtract
//! the all-ones mask), then look the levels up (`vpermps` / blend / gather as in decoding).

use super::Codebooks;
use crate::simd::avx2::tail_mask;
use crate::simd::x86::Vector;
use std::arch::x86_64::*;

/// # Safety
/// CPU must support AVX2+FMA+F16C; shapes as checked by `super::quantize`.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn quantize(books: Codebooks<'_>, y: &[f32], codes: &mut [u8], recon: &mut [f32]) {
    let gather = _mm256_setr_epi8(
        0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, 0, 4, 8, 12, -1, -1, -1, -1,
        -1, -1, -1, -1, -1, -1, -1, -1,
    );
    for (first, len, t, l, width) in books.runs() {
        let mut padded = [0.0f32; 16];
        let n_l = l.len().min(16);
        padded[..n_l].copy_from_slice(&l[..n_l]);
        // SAFETY: 16-element local array.
        let (t0, t1) = unsafe {
            (
                _mm256_loadu_ps(padded.as_ptr()),
                _mm256_loadu_ps(padded.as_ptr().add(8)),
            )
        };
        let mut c = first;
        while c < first + len {
            let n = (first + len - c).min(8);
            let mask = tail_mask(n);
            // SAFETY: masked lanes stay inside y / recon (c + n <= d).
            unsafe {
                let x = _mm256_maskload_ps(y.as_ptr().add(c), mask);
                let mut count = _mm256_setzero_si256();
                for &th in t {
                    let below = _mm256_cmp_ps::<_CMP_LT_OQ>(_mm256_set1_ps(th), x);
                    count = _mm256_sub_epi32(count, _mm256_castps_si256(below));
                }
                let v = match width {
                    1..=3 => _mm256_permutevar8x32_ps(t0, count),
                    4 => _mm256_blendv_ps(
                        _mm256_permutevar8x32_ps(t0, count),
                        _mm256_permutevar8x32_ps(t1, count),
                        _mm256_castsi256_ps(_mm256_slli_epi32::<28>(count)),
                    ),
                    _ => _mm256_i32gather_ps::<4>(l.as_ptr(), count),
                };
                __m256::store_part(recon.as_mut_ptr().add(c), n, v);
                let b = _mm256_shuffle_epi8(count, gather);
                let lo = _mm_cvtsi128_si32(_mm256_castsi256_si128(b)) as u32 as u64;
                let hi = _mm_cvtsi128_si32(_mm256_extracti128_si256::<1>(b)) as u32 as u64;
                codes[c..c + n].copy_from_slice(&(lo | hi << 32).to_le_bytes()[..n]);
            }
            c += 8;
        }
    }
}
