//! Reference softmax pieces, in the canonical operation order.

pub fn max_f32(x: &[f32]) -> f32 {
    x.iter().copied().fold(f32::NEG_INFINITY, f32::max)
}

/// Canonical exp and canonical 16-lane sum (see `crate::canon`).
pub fn exp_sub_sum(x: &mut [f32], m: f32) -> f32 {
    for v in x.iter_mut() {
        *v = crate::canon::exp(*v - m);
    }
    crate::canon::sum(x)
}
