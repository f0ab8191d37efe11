//! NEON SwiGLU with the shared vector exp.

use crate::simd::neon::exp;
use core::arch::aarch64::*;

/// # Safety
/// aarch64; equal lengths.
pub unsafe fn swiglu(gate: &mut [f32], up: &[f32]) {
    assert_eq!(gate.len(), up.len());
    let n = gate.len();
    let mut i = 0;
    // SAFETY: i + 4 <= n for both slices.
    unsafe {
        let one = vdupq_n_f32(1.0);
        while i + 4 <= n {
            let g = vld1q_f32(gate.as_ptr().add(i));
            let u = vld1q_f32(up.as_ptr().add(i));
            let denom = vaddq_f32(one, exp(vnegq_f32(g)));
            vst1q_f32(gate.as_mut_ptr().add(i), vmulq_f32(vdivq_f32(g, denom), u));
            i += 4;
        }
    }
    for j in i..n {
        gate[j] = gate[j] / (1.0 + crate::canon::exp(-gate[j])) * up[j];
    }
}
