//! WASM SIMD128 RMSNorm.

use crate::simd::simd128::hsum;
use core::arch::wasm32::*;

/// # Safety
/// None beyond the slices (checked shapes).
pub unsafe fn rmsnorm(x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) {
    super::check_shapes(x, weight, out);
    let n = x.len();
    let n4 = n / 4 * 4;
    let (xp, wp, op) = (x.as_ptr(), weight.as_ptr(), out.as_mut_ptr());
    // SAFETY: every 4-lane access has i + 4 <= n; all three slices have length n.
    unsafe {
        let (mut acc0, mut acc1) = (f32x4_splat(0.0), f32x4_splat(0.0));
        let mut i = 0;
        while i + 8 <= n {
            let a = v128_load(xp.add(i) as *const v128);
            let b = v128_load(xp.add(i + 4) as *const v128);
            acc0 = f32x4_add(acc0, f32x4_mul(a, a));
            acc1 = f32x4_add(acc1, f32x4_mul(b, b));
            i += 8;
        }
        if i < n4 {
            let a = v128_load(xp.add(i) as *const v128);
            acc0 = f32x4_add(acc0, f32x4_mul(a, a));
        }
        let mut sum = hsum(f32x4_add(acc0, acc1));
        sum += x[n4..].iter().map(|v| v * v).sum::<f32>();
        let inv_rms = 1.0 / (sum / n.max(1) as f32 + eps).sqrt();
        let scale = f32x4_splat(inv_rms);
        let mut i = 0;
        while i < n4 {
            let v = f32x4_mul(v128_load(xp.add(i) as *const v128), scale);
            let g = v128_load(wp.add(i) as *const v128);
            v128_store(op.add(i) as *mut v128, f32x4_mul(v, g));
            i += 4;
        }
        for j in n4..n {
            out[j] = x[j] * inv_rms * weight[j];
        }
    }
}
