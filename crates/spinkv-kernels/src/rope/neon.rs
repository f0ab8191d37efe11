//! NEON rotate_half RoPE.

use core::arch::aarch64::*;

/// # Safety
/// aarch64.
pub unsafe fn rope(x: &mut [f32], head_dim: usize, cos: &[f32], sin: &[f32]) {
    super::check_shapes(x, head_dim, cos, sin);
    let half = head_dim / 2;
    let half4 = half / 4 * 4;
    for head in x.chunks_exact_mut(head_dim) {
        let (first, second) = head.split_at_mut(half);
        let mut i = 0;
        while i < half4 {
            // SAFETY: i + 4 <= half, the length of first, second, cos and sin.
            unsafe {
                let a = vld1q_f32(first.as_ptr().add(i));
                let b = vld1q_f32(second.as_ptr().add(i));
                let c = vld1q_f32(cos.as_ptr().add(i));
                let s = vld1q_f32(sin.as_ptr().add(i));
                vst1q_f32(first.as_mut_ptr().add(i), vfmsq_f32(vmulq_f32(a, c), b, s));
                vst1q_f32(second.as_mut_ptr().add(i), vfmaq_f32(vmulq_f32(b, c), a, s));
            }
            i += 4;
        }
        for j in half4..half {
            let (a, b) = (first[j], second[j]);
            first[j] = crate::canon::fma(-b, sin[j], a * cos[j]);
            second[j] = crate::canon::fma(a, sin[j], b * cos[j]);
        }
    }
}
