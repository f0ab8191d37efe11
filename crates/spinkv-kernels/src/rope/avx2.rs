//! AVX2 rotate_half RoPE: both halves of a head advance 8 lanes at a time.

use std::arch::x86_64::*;

/// # Safety
/// CPU must support AVX2+FMA+F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn rope(x: &mut [f32], head_dim: usize, cos: &[f32], sin: &[f32]) {
    super::check_shapes(x, head_dim, cos, sin);
    let half = head_dim / 2;
    let half8 = half / 8 * 8;
    for head in x.chunks_exact_mut(head_dim) {
        let (first, second) = head.split_at_mut(half);
        let mut i = 0;
        while i < half8 {
            // SAFETY: i + 8 <= half, the length of first, second, cos and sin.
            unsafe {
                let a = _mm256_loadu_ps(first.as_ptr().add(i));
                let b = _mm256_loadu_ps(second.as_ptr().add(i));
                let c = _mm256_loadu_ps(cos.as_ptr().add(i));
                let s = _mm256_loadu_ps(sin.as_ptr().add(i));
                let new_a = _mm256_fnmadd_ps(b, s, _mm256_mul_ps(a, c));
                let new_b = _mm256_fmadd_ps(a, s, _mm256_mul_ps(b, c));
                _mm256_storeu_ps(first.as_mut_ptr().add(i), new_a);
                _mm256_storeu_ps(second.as_mut_ptr().add(i), new_b);
            }
            i += 8;
        }
        for j in half8..half {
            let (a, b) = (first[j], second[j]);
            first[j] = crate::canon::fma(-b, sin[j], a * cos[j]);
            second[j] = crate::canon::fma(a, sin[j], b * cos[j]);
        }
    }
}
