//! NEON softmax pieces with the softmax polynomial exp.

use crate::simd::neon::{exp_softmax, hmax, reduce16};
use core::arch::aarch64::*;

/// # Safety
/// aarch64.
pub unsafe fn max_f32(x: &[f32]) -> f32 {
    let n = x.len();
    let mut i = 0;
    // SAFETY: i + 4 <= n.
    let mut m = unsafe {
        let mut vmax = vdupq_n_f32(f32::NEG_INFINITY);
        while i + 4 <= n {
            vmax = vmaxq_f32(vmax, vld1q_f32(x.as_ptr().add(i)));
            i += 4;
        }
        hmax(vmax)
    };
    for &v in &x[i..] {
        m = m.max(v);
    }
    m
}

/// # Safety
/// aarch64.
pub unsafe fn exp_sub_sum(x: &mut [f32], m: f32) -> f32 {
    let n = x.len();
    let p = x.as_mut_ptr();
    // SAFETY: full accesses cover i..i+16 <= n; the tail goes through a local copy padded
    // with -inf (whose exponentials are exactly 0).
    unsafe {
        let vm = vdupq_n_f32(m);
        let mut acc = [vdupq_n_f32(0.0); 4];
        let mut i = 0;
        while i + 16 <= n {
            for (k, acc) in acc.iter_mut().enumerate() {
                let e = exp_softmax(vsubq_f32(vld1q_f32(p.add(i + 4 * k)), vm));
                vst1q_f32(p.add(i + 4 * k), e);
                *acc = vaddq_f32(*acc, e);
            }
            i += 16;
        }
        if i < n {
            let mut tail = [f32::NEG_INFINITY; 16];
            tail[..n - i].copy_from_slice(&x[i..]);
            for (k, acc) in acc.iter_mut().enumerate() {
                let e = exp_softmax(vsubq_f32(vld1q_f32(tail.as_ptr().add(4 * k)), vm));
                vst1q_f32(tail.as_mut_ptr().add(4 * k), e);
                *acc = vaddq_f32(*acc, e);
            }
            x[i..].copy_from_slice(&tail[..n - i]);
        }
        reduce16(acc)
    }
}
