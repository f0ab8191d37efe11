//! NEON / SIMD128 rotate_half RoPE, one body for both 4-lane ISAs (fused on NEON only:
//! SIMD128 has no FMA).

use crate::simd::quad;

/// # Safety
/// NEON or SIMD128 (whichever this build has); shapes are checked here.
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
                let a = quad::load(first.as_ptr().add(i));
                let b = quad::load(second.as_ptr().add(i));
                let c = quad::load(cos.as_ptr().add(i));
                let s = quad::load(sin.as_ptr().add(i));
                let new_a = quad::neg_mul_add(b, s, quad::mul(a, c));
                let new_b = quad::mul_add(a, s, quad::mul(b, c));
                quad::store(first.as_mut_ptr().add(i), new_a);
                quad::store(second.as_mut_ptr().add(i), new_b);
            }
            i += 4;
        }
        for j in half4..half {
            let (a, b) = (first[j], second[j]);
            first[j] = quad::mul_add_f32(-b, sin[j], a * cos[j]);
            second[j] = quad::mul_add_f32(a, sin[j], b * cos[j]);
        }
    }
}
