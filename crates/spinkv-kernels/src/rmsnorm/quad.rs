//! NEON / SIMD128 RMSNorm, one body for both 4-lane ISAs; the sum of squares is the ISA's
//! own (`quad::sum_squares`: canonical on NEON).

use crate::simd::quad;

/// # Safety
/// NEON or SIMD128 (whichever this build has); shapes are checked here.
pub unsafe fn rmsnorm(x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) {
    super::check_shapes(x, weight, out);
    let n = x.len();
    let n4 = n / 4 * 4;
    let (xp, wp, op) = (x.as_ptr(), weight.as_ptr(), out.as_mut_ptr());
    // SAFETY: every 4-lane access has i + 4 <= n; all three slices have length n.
    unsafe {
        let sum = quad::sum_squares(x);
        let inv_rms = 1.0 / (sum / n.max(1) as f32 + eps).sqrt();
        let scale = quad::splat(inv_rms);
        let mut i = 0;
        while i < n4 {
            let v = quad::mul(quad::load(xp.add(i)), scale);
            quad::store(op.add(i), quad::mul(v, quad::load(wp.add(i))));
            i += 4;
        }
        for j in n4..n {
            out[j] = x[j] * inv_rms * weight[j];
        }
    }
}
