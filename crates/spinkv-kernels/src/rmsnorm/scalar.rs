//! Reference RMSNorm.

pub fn rmsnorm(x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) {
    super::check_shapes(x, weight, out);
    let mean_square = crate::canon::dot(x, x, |v| v) / x.len().max(1) as f32;
    let inv_rms = 1.0 / (mean_square + eps).sqrt();
    for ((o, &v), &g) in out.iter_mut().zip(x).zip(weight) {
        *o = v * inv_rms * g;
    }
}
