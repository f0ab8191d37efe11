//! NEON steps of the 4-lane integer-grid value scan (`quad.rs`): a pair of rows' int16 levels
//! multiplied by each row's grid weight and added to int32 sums by `vmlal_lane_s16` (baseline
//! NEON), the chunk's largest weight found four lanes at a time.

use core::arch::aarch64::*;

use super::super::grid::CHUNK;
use crate::codes::quad::Levels8;

/// Sums of 8 channels: channels 0..4, then 4..8.
pub(super) type Sums = [int32x4_t; 2];
/// Two rows' levels of 8 channels.
pub(super) type Pair = (Levels8, Levels8);

#[inline(always)]
pub(super) fn zero_sums() -> int32x4_t {
    // SAFETY: NEON is part of the aarch64 baseline, so this build has it.
    unsafe { vdupq_n_s32(0) }
}

#[inline(always)]
pub(super) fn pair(a: Levels8, b: Levels8) -> Pair {
    (a, b)
}

/// `sums` plus the pair's levels times their grid weights, `weights` holding the first row's in
/// its low 16 bits and the second's in its high 16.
#[inline(always)]
pub(super) fn add_pair(sums: &mut Sums, (a, b): Pair, weights: i32) {
    // SAFETY: NEON is part of the aarch64 baseline, so this build has it.
    unsafe {
        // Lanes 0 and 1: the first and the second row's weight.
        let w = vreinterpret_s16_s32(vdup_n_s32(weights));
        let low = vmlal_lane_s16::<0>(sums[0], vget_low_s16(a), w);
        sums[0] = vmlal_lane_s16::<1>(low, vget_low_s16(b), w);
        let high = vmlal_high_lane_s16::<0>(sums[1], a, w);
        sums[1] = vmlal_high_lane_s16::<1>(high, b, w);
    }
}

/// The 8 sums as f32 (exact: below 2^24).
#[inline(always)]
pub(super) fn to_f32(sums: Sums) -> [f32; 8] {
    let mut out = [0.0f32; 8];
    // SAFETY: writes the 8 floats of a local array; NEON is aarch64 baseline.
    unsafe {
        vst1q_f32(out.as_mut_ptr(), vcvtq_f32_s32(sums[0]));
        vst1q_f32(out.as_mut_ptr().add(4), vcvtq_f32_s32(sums[1]));
    }
    out
}

/// The largest `|w|`: `vmaxnm` is `f32::max`'s rule, so the same value as
/// `grid::quantize_chunk`'s fold.
#[inline(always)]
pub(super) fn largest_magnitude(ws: &[f32; CHUNK]) -> f32 {
    // SAFETY: each load reads the 4 floats of `four`; NEON is aarch64 baseline.
    unsafe {
        let mut m = vdupq_n_f32(0.0);
        for four in ws.chunks_exact(4) {
            m = vmaxnmq_f32(m, vabsq_f32(vld1q_f32(four.as_ptr())));
        }
        vmaxnmvq_f32(m)
    }
}
