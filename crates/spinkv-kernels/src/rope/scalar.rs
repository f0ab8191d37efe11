//! Reference rotate_half RoPE.

pub fn rope(x: &mut [f32], head_dim: usize, cos: &[f32], sin: &[f32]) {
    super::check_shapes(x, head_dim, cos, sin);
    let half = head_dim / 2;
    for head in x.chunks_exact_mut(head_dim) {
        let (first, second) = head.split_at_mut(half);
        for i in 0..half {
            let (a, b) = (first[i], second[i]);
            // As the SIMD versions fuse them: a·c − b·s and b·c + a·s with one rounding each.
            first[i] = crate::canon::fma(-b, sin[i], a * cos[i]);
            second[i] = crate::canon::fma(a, sin[i], b * cos[i]);
        }
    }
}
