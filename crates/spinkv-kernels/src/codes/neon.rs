//! NEON pieces of the 4-lane code kernels (`quad.rs`, `cut128.rs`): `tbl` puts each code's one
//! or two bytes into its own 16-bit lane, a variable shift and a mask leave the code; levels
//! (up to 4 bits) come from a byte-table lookup of the 4 bytes of each f32 level (`tbl` over up
//! to 64 bytes) or, as int16, from `tbl` of 16 int8 levels; wider codes from a scalar table.

use super::super::windows::WINDOWS_16;
use super::super::Segment;
use super::{BYTE_OF_F32, REP};
use core::arch::aarch64::*;

/// 8 codes in 16-bit lanes.
pub(super) type Codes = uint16x8_t;
/// 16 bytes: a row's load, a cut's byte shuffle, a table of int8 levels.
pub(super) type Bytes16 = uint8x16_t;
/// 8 int16 levels (what the integer scans multiply).
pub(crate) type Levels8 = int16x8_t;
/// A cut's per-lane shifts, negated: `vshlq_u16` shifts right by a negative count.
pub(super) type LaneShifts = int16x8_t;

#[inline(always)]
pub(crate) fn zero_levels8() -> Levels8 {
    // SAFETY: NEON is part of the aarch64 baseline, so this build has it.
    unsafe { vdupq_n_s16(0) }
}

#[inline(always)]
pub(super) fn load16(bytes: &[u8; 16]) -> Bytes16 {
    // SAFETY: reads the 16 bytes of `bytes`; NEON is aarch64 baseline.
    unsafe { vld1q_u8(bytes.as_ptr()) }
}

/// `word`'s 8 bytes in both halves.
#[inline(always)]
pub(super) fn broadcast(word: u64) -> Bytes16 {
    // SAFETY: NEON is part of the aarch64 baseline, so this build has it.
    unsafe { vreinterpretq_u8_u64(vdupq_n_u64(word)) }
}

/// The shifts `cut` takes for lane shifts `shift[..8]` (a `WINDOWS_16` entry).
#[inline(always)]
pub(super) fn lane_shifts(shift: &[u32; 16]) -> LaneShifts {
    let neg: [i16; 8] = core::array::from_fn(|k| -(shift[k] as i16));
    // SAFETY: reads the 8 int16s of a local array; NEON is aarch64 baseline.
    unsafe { vld1q_s16(neg.as_ptr()) }
}

/// The mask that keeps a code of `width` bits in each 16-bit lane.
#[inline(always)]
pub(super) fn code_mask(width: u32) -> Codes {
    // SAFETY: NEON is part of the aarch64 baseline, so this build has it.
    unsafe { vdupq_n_u16((1u16 << width) - 1) }
}

/// 8 codes cut from `bytes`: `ctrl` gives each lane its code's one or two bytes (an index of 16
/// or more gives 0), the shift and the mask leave the code.
#[inline(always)]
pub(super) fn cut(bytes: Bytes16, ctrl: Bytes16, shifts: LaneShifts, mask: Codes) -> Codes {
    // SAFETY: NEON is part of the aarch64 baseline, so this build has it.
    unsafe {
        let windows = vreinterpretq_u16_u8(vqtbl1q_u8(bytes, ctrl));
        vandq_u16(vshlq_u16(windows, shifts), mask)
    }
}

/// The int16 levels of two groups' codes (each below 16) in `table`, 16 int8 levels.
#[inline(always)]
pub(super) fn levels16(table: Bytes16, a: Codes, b: Codes) -> (Levels8, Levels8) {
    // SAFETY: NEON is part of the aarch64 baseline, so this build has it.
    unsafe {
        // Each code is the low byte of its lane: the even bytes of `a`, then of `b`.
        let idx = vuzp1q_u8(vreinterpretq_u8_u16(a), vreinterpretq_u8_u16(b));
        let bytes = vqtbl1q_s8(vreinterpretq_s8_u8(table), idx);
        (vmovl_s8(vget_low_s8(bytes)), vmovl_high_s8(bytes))
    }
}

/// One segment's constants in registers.
#[derive(Clone, Copy)]
pub(super) struct SegmentPlan {
    pub(super) seg: Segment,
    ctrl: Bytes16,
    shifts: LaneShifts,
    mask: Codes,
    /// Levels 0..16 as 64 bytes (zero-padded).
    bytes: uint8x16x4_t,
    table: *const f32,
}

impl SegmentPlan {
    /// # Safety
    /// `table` (the segment's levels) alive while the plan is used.
    #[inline(always)]
    pub(super) unsafe fn new(seg: Segment, table: &[f32]) -> Self {
        let (ctrl, shift) = &WINDOWS_16[seg.width as usize];
        let mut padded = [0.0f32; 16];
        let n = table.len().min(16);
        padded[..n].copy_from_slice(&table[..n]);
        // SAFETY: every load reads inside the local arrays.
        unsafe {
            let p = padded.as_ptr() as *const u8;
            SegmentPlan {
                seg,
                ctrl: vld1q_u8(ctrl.as_ptr()),
                shifts: lane_shifts(shift),
                mask: code_mask(seg.width),
                bytes: uint8x16x4_t(
                    vld1q_u8(p),
                    vld1q_u8(p.add(16)),
                    vld1q_u8(p.add(32)),
                    vld1q_u8(p.add(48)),
                ),
                table: table.as_ptr(),
            }
        }
    }

    /// The 8 codes packed at the bottom of `word`.
    #[inline(always)]
    pub(super) unsafe fn codes_of(&self, word: u64) -> Codes {
        cut(broadcast(word), self.ctrl, self.shifts, self.mask)
    }

    /// `dst[..8]` = levels of 8 codes.
    ///
    /// # Safety
    /// `dst` valid for 8 floats; the table is alive.
    #[inline(always)]
    pub(super) unsafe fn levels8(&self, idx: Codes, dst: *mut f32) {
        // SAFETY: loads of constant arrays, stores to `dst[..8]` (caller).
        unsafe {
            if self.seg.width <= 4 {
                let c8 = vmovn_u16(idx);
                let c = vcombine_u8(c8, c8);
                let offsets = vld1q_u8(BYTE_OF_F32.as_ptr());
                let half = |rep: &[u8; 16]| {
                    let r = vqtbl1q_u8(c, vld1q_u8(rep.as_ptr()));
                    let byte_idx = vaddq_u8(vshlq_n_u8::<2>(r), offsets);
                    vreinterpretq_f32_u8(vqtbl4q_u8(self.bytes, byte_idx))
                };
                vst1q_f32(dst, half(&REP[0]));
                vst1q_f32(dst.add(4), half(&REP[1]));
            } else {
                let mut codes = [0u16; 8];
                vst1q_u16(codes.as_mut_ptr(), idx);
                // Codes are below 2^width and the table holds 2^width levels.
                for (k, &code) in codes.iter().enumerate() {
                    *dst.add(k) = *self.table.add(code as usize);
                }
            }
        }
    }
}

/// The 8 codes as bytes.
#[inline(always)]
pub(super) unsafe fn narrow8(codes: Codes) -> [u8; 8] {
    let mut eight = [0u8; 8];
    // SAFETY: the store fills the local array.
    unsafe { vst1_u8(eight.as_mut_ptr(), vmovn_u16(codes)) };
    eight
}

/// Packs groups of 8 codes of one width into words: each code widened to 64 bits and
/// shifted to `k·w`.
pub(super) struct Packer {
    width: u32,
    shifts: [int64x2_t; 4],
}

impl Packer {
    #[inline(always)]
    pub(super) unsafe fn new(width: u32) -> Self {
        let w = width as i64;
        let shifts = core::array::from_fn(|i| {
            let pair = [2 * i as i64 * w, (2 * i as i64 + 1) * w];
            // SAFETY: loads two lanes of the local array.
            unsafe { vld1q_s64(pair.as_ptr()) }
        });
        Packer { width, shifts }
    }

    /// The bit stream of 8 codes (each masked to the width).
    #[inline(always)]
    pub(super) unsafe fn word(&self, eight: [u8; 8]) -> u64 {
        // SAFETY: register work on a local array.
        unsafe {
            let keep = vdup_n_u8(((1u16 << self.width) - 1) as u8);
            let c = vand_u8(vld1_u8(eight.as_ptr()), keep);
            let c16 = vmovl_u8(c);
            let (c32a, c32b) = (vmovl_u16(vget_low_u16(c16)), vmovl_high_u16(c16));
            let quads = [
                vmovl_u32(vget_low_u32(c32a)),
                vmovl_high_u32(c32a),
                vmovl_u32(vget_low_u32(c32b)),
                vmovl_high_u32(c32b),
            ];
            let mut acc = vdupq_n_u64(0);
            for (q, s) in quads.iter().zip(&self.shifts) {
                acc = vorrq_u64(acc, vshlq_u64(*q, *s));
            }
            vgetq_lane_u64::<0>(acc) | vgetq_lane_u64::<1>(acc)
        }
    }
}
