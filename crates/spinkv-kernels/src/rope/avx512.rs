//! AVX-512 rotate_half RoPE: both halves of a head advance 16 lanes at a time, masked tails.

use crate::simd::avx512::tail_mask;
use std::arch::x86_64::*;

/// # Safety
/// CPU must support AVX-512 F/BW/VL (+AVX2/FMA/F16C).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
pub unsafe fn rope(x: &mut [f32], head_dim: usize, cos: &[f32], sin: &[f32]) {
    super::check_shapes(x, head_dim, cos, sin);
    let half = head_dim / 2;
    for head in x.chunks_exact_mut(head_dim) {
        let (a_ptr, b_ptr) = (head.as_mut_ptr(), head[half..].as_mut_ptr());
        let mut i = 0;
        while i < half {
            let m = tail_mask((half - i).min(16));
            // SAFETY: masked lanes stay below half, the length of both halves, cos and sin.
            unsafe {
                let a = _mm512_maskz_loadu_ps(m, a_ptr.add(i));
                let b = _mm512_maskz_loadu_ps(m, b_ptr.add(i));
                let c = _mm512_maskz_loadu_ps(m, cos.as_ptr().add(i));
                let s = _mm512_maskz_loadu_ps(m, sin.as_ptr().add(i));
                let new_a = _mm512_fnmadd_ps(b, s, _mm512_mul_ps(a, c));
                let new_b = _mm512_fmadd_ps(a, s, _mm512_mul_ps(b, c));
                _mm512_mask_storeu_ps(a_ptr.add(i), m, new_a);
                _mm512_mask_storeu_ps(b_ptr.add(i), m, new_b);
            }
            i += 16;
        }
    }
}
