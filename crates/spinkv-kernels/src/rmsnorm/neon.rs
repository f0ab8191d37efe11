//! NEON RMSNorm.

use crate::simd::neon::dot16;
use core::arch::aarch64::*;

/// # Safety
/// aarch64.
pub unsafe fn rmsnorm(x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) {
    super::check_shapes(x, weight, out);
    let n = x.len();
    let n4 = n / 4 * 4;
    let (xp, wp, op) = (x.as_ptr(), weight.as_ptr(), out.as_mut_ptr());
    // SAFETY: every 4-lane access has i + 4 <= n; all three slices have length n.
    unsafe {
        let sum = dot16(xp, xp, n);
        let inv_rms = 1.0 / (sum / n.max(1) as f32 + eps).sqrt();
        let scale = vdupq_n_f32(inv_rms);
        let mut i = 0;
        while i < n4 {
            let v = vmulq_f32(vld1q_f32(xp.add(i)), scale);
            vst1q_f32(op.add(i), vmulq_f32(v, vld1q_f32(wp.add(i))));
            i += 4;
        }
        for j in n4..n {
            out[j] = x[j] * inv_rms * weight[j];
        }
    }
}
