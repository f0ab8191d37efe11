//! WASM SIMD128 rotate_half RoPE.

use core::arch::wasm32::*;

/// # Safety
/// None beyond the slices (checked shapes).
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
                let a = v128_load(first.as_ptr().add(i) as *const v128);
                let b = v128_load(second.as_ptr().add(i) as *const v128);
                let c = v128_load(cos.as_ptr().add(i) as *const v128);
                let s = v128_load(sin.as_ptr().add(i) as *const v128);
                let new_a = f32x4_sub(f32x4_mul(a, c), f32x4_mul(b, s));
                let new_b = f32x4_add(f32x4_mul(b, c), f32x4_mul(a, s));
                v128_store(first.as_mut_ptr().add(i) as *mut v128, new_a);
                v128_store(second.as_mut_ptr().add(i) as *mut v128, new_b);
            }
            i += 4;
        }
        for j in half4..half {
            let (a, b) = (first[j], second[j]);
            first[j] = a * cos[j] - b * sin[j];
            second[j] = b * cos[j] + a * sin[j];
        }
    }
}
