//! NEON steps of the 4-lane integer key scan (`quad.rs`): int16 products summed into int32
//! lanes by `vmlal_s16` (baseline NEON: no dependence on the optional dot-product extension),
//! four rows' sums reduced by two levels of `vpaddq_s32`.

use core::arch::aarch64::*;

use crate::codes::quad::Levels8;

/// Four int32 partial sums of one row (their total is the row's sum).
pub(super) type Sums = int32x4_t;

#[inline(always)]
pub(super) fn zero_sums() -> Sums {
    // SAFETY: NEON is part of the aarch64 baseline, so this build has it.
    unsafe { vdupq_n_s32(0) }
}

#[inline(always)]
pub(super) fn load_query8(q: &[i16; 8]) -> Levels8 {
    // SAFETY: reads the 8 int16s of `q`; NEON is aarch64 baseline.
    unsafe { vld1q_s16(q.as_ptr()) }
}

/// `acc` plus the products of 8 levels and 8 query coordinates, in int32 lanes.
#[inline(always)]
pub(super) fn dot_add(acc: Sums, levels: Levels8, q: Levels8) -> Sums {
    // SAFETY: NEON is part of the aarch64 baseline, so this build has it.
    unsafe {
        let low = vmlal_s16(acc, vget_low_s16(levels), vget_low_s16(q));
        vmlal_high_s16(low, levels, q)
    }
}

/// Lane `r` of the result: the sum of the four int32 lanes of `v[r]` (wrapping, as the
/// scalar reference's sum).
#[inline(always)]
pub(super) fn transpose_sum(v: [Sums; 4]) -> Sums {
    // [a0+a1, a2+a3, b0+b1, b2+b3] and the same of c, d; then each row's two halves.
    // SAFETY: NEON is part of the aarch64 baseline, so this build has it.
    unsafe { vpaddq_s32(vpaddq_s32(v[0], v[1]), vpaddq_s32(v[2], v[3])) }
}

/// `super::epilogue` of four rows: `(factor · sum) · scale` per lane.
#[inline(always)]
pub(super) fn scores4(factor: f32, sums: Sums, scales: &[f32; 4]) -> [f32; 4] {
    let mut out = [0.0f32; 4];
    // SAFETY: reads the 4 floats of `scales`, writes the 4 of a local array; NEON is aarch64
    // baseline.
    unsafe {
        let x = vmulq_f32(vdupq_n_f32(factor), vcvtq_f32_s32(sums));
        vst1q_f32(out.as_mut_ptr(), vmulq_f32(x, vld1q_f32(scales.as_ptr())));
    }
    out
}

#[inline(always)]
pub(super) fn lanes(sums: Sums) -> [i32; 4] {
    let mut out = [0i32; 4];
    // SAFETY: writes the 4 int32s of a local array; NEON is aarch64 baseline.
    unsafe { vst1q_s32(out.as_mut_ptr(), sums) };
    out
}
