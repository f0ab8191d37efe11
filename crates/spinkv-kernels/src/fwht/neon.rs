//! NEON FWHT: the stages with `h < 4` inside each 4-lane vector, the others as vector
//! butterflies across blocks. Bit-identical to scalar.

use core::arch::aarch64::*;

/// # Safety
/// aarch64; `x.len() == signs.len()`, a power of two.
pub unsafe fn signed_fwht(x: &mut [f32], signs: &[f32]) {
    if x.len() < 4 {
        return super::scalar::signed_fwht(x, signs);
    }
    // SAFETY: lengths checked by the caller.
    unsafe {
        crate::vec_f32::neon::mul_f32(x, signs);
        fwht(x);
    }
}

/// # Safety
/// As [`signed_fwht`].
pub unsafe fn fwht_signed(x: &mut [f32], signs: &[f32]) {
    if x.len() < 4 {
        return super::scalar::fwht_signed(x, signs);
    }
    // SAFETY: as above.
    unsafe {
        fwht(x);
        crate::vec_f32::neon::mul_f32(x, signs);
    }
}

unsafe fn fwht(x: &mut [f32]) {
    let n = x.len();
    let p = x.as_mut_ptr();
    // SAFETY (all loads and stores): indices stay below n, a multiple of 4.
    unsafe {
        let odd = vld1q_u32([0, !0, 0, !0].as_ptr());
        let upper = vld1q_u32([0, 0, !0, !0].as_ptr());
        for i in (0..n).step_by(4) {
            let mut v = vld1q_f32(p.add(i));
            let t = vrev64q_f32(v);
            v = vbslq_f32(odd, vsubq_f32(t, v), vaddq_f32(v, t));
            let t = vextq_f32::<2>(v, v);
            v = vbslq_f32(upper, vsubq_f32(t, v), vaddq_f32(v, t));
            vst1q_f32(p.add(i), v);
        }
        let mut h = 4;
        while h < n {
            for block in (0..n).step_by(2 * h) {
                for i in (block..block + h).step_by(4) {
                    let u = vld1q_f32(p.add(i));
                    let v = vld1q_f32(p.add(i + h));
                    vst1q_f32(p.add(i), vaddq_f32(u, v));
                    vst1q_f32(p.add(i + h), vsubq_f32(u, v));
                }
            }
            h *= 2;
        }
        crate::vec_f32::neon::scale_f32(x, 1.0 / (n as f32).sqrt());
    }
}
