//! NEON scale decoding, 4 tokens at a time (separate multiply and add: no FMA).

use super::{EXP2_MAX, EXP2_MIN, EXP2_P};
use core::arch::aarch64::*;

/// # Safety
/// aarch64; equal lengths.
pub unsafe fn decode_log_u8(codes: &[u8], lo: f32, step: f32, out: &mut [f32]) {
    let n = codes.len();
    let mut i = 0;
    // SAFETY: i + 4 <= n for both slices; the 4 codes are copied into a local word.
    unsafe {
        let (vlo, vstep) = (vdupq_n_f32(lo), vdupq_n_f32(step));
        while i + 4 <= n {
            let word = u32::from_le_bytes(codes[i..i + 4].try_into().expect("4 bytes"));
            let c = vmovl_u16(vget_low_u16(vmovl_u8(vcreate_u8(word as u64))));
            let cm1 = vcvtq_f32_s32(vsubq_s32(vreinterpretq_s32_u32(c), vdupq_n_s32(1)));
            let v = exp2(vaddq_f32(vlo, vmulq_f32(cm1, vstep)));
            let zero = vceqq_u32(c, vdupq_n_u32(0));
            vst1q_f32(
                out.as_mut_ptr().add(i),
                vreinterpretq_f32_u32(vbicq_u32(vreinterpretq_u32_f32(v), zero)),
            );
            i += 4;
        }
    }
    super::scalar::decode_log_u8(&codes[i..], lo, step, &mut out[i..]);
}

#[inline(always)]
unsafe fn exp2(x: float32x4_t) -> float32x4_t {
    let x = vminq_f32(vmaxq_f32(x, vdupq_n_f32(EXP2_MIN)), vdupq_n_f32(EXP2_MAX));
    let n = vrndmq_f32(vaddq_f32(x, vdupq_n_f32(0.5)));
    let r = vsubq_f32(x, n);
    let mut p = vdupq_n_f32(EXP2_P[0]);
    for &c in &EXP2_P[1..] {
        p = vaddq_f32(vmulq_f32(p, r), vdupq_n_f32(c));
    }
    let two_r = vaddq_f32(vdupq_n_f32(1.0), vmulq_f32(r, p));
    let two_n = vshlq_n_s32::<23>(vaddq_s32(vcvtq_s32_f32(n), vdupq_n_s32(127)));
    vmulq_f32(two_r, vreinterpretq_f32_s32(two_n))
}

/// # Safety
/// aarch64; `out` as long as the runs together.
pub unsafe fn decode_log_u8_runs(runs: &[super::LogRun<'_>], out: &mut [f32]) {
    super::decode_runs!(runs, out);
}
