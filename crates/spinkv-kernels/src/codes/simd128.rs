//! WASM SIMD128 pieces of the 4-lane code kernels (`quad.rs`, `cut128.rs`): a swizzle puts
//! each code's one or two bytes into its own 16-bit lane, a per-lane multiply and a shift leave
//! the code (SIMD128 has no per-lane shift); levels (up to 4 bits) come from swizzles of the
//! levels' bytes or, as int16, from one swizzle of 16 int8 levels; wider codes from a scalar
//! table.

use super::super::windows::WINDOWS_16;
use super::super::Segment;
use super::{BYTE_OF_F32, REP};
use core::arch::wasm32::*;

/// 8 codes in 16-bit lanes.
pub(super) type Codes = v128;
/// 16 bytes: a row's load, a cut's byte shuffle, a table of int8 levels.
pub(super) type Bytes16 = v128;
/// 8 int16 levels (what the integer scans multiply).
pub(crate) type Levels8 = v128;
/// A cut's per-lane shifts as multipliers `2^(8 - shift)`: multiply, then shift every lane
/// right by 8.
pub(super) type LaneShifts = v128;

#[inline(always)]
pub(crate) fn zero_levels8() -> Levels8 {
    i16x8_splat(0)
}

#[inline(always)]
pub(super) fn load16(bytes: &[u8; 16]) -> Bytes16 {
    // SAFETY: reads the 16 bytes of `bytes` (`v128_load` takes any alignment).
    unsafe { v128_load(bytes.as_ptr() as *const v128) }
}

/// `word`'s 8 bytes in both halves.
#[inline(always)]
pub(super) fn broadcast(word: u64) -> Bytes16 {
    u64x2_splat(word)
}

/// The shifts `cut` takes for lane shifts `shift[..8]` (a `WINDOWS_16` entry).
#[inline(always)]
pub(super) fn lane_shifts(shift: &[u32; 16]) -> LaneShifts {
    let mul: [u16; 8] = core::array::from_fn(|k| 1u16 << (8 - shift[k]));
    // SAFETY: reads the 8 u16s of a local array.
    unsafe { v128_load(mul.as_ptr() as *const v128) }
}

/// The mask that keeps a code of `width` bits in each 16-bit lane.
#[inline(always)]
pub(super) fn code_mask(width: u32) -> Codes {
    u16x8_splat((1u16 << width) - 1)
}

/// 8 codes cut from `bytes`: `ctrl` gives each lane its code's one or two bytes (an index of 16
/// or more gives 0), the multiply and shift and the mask leave the code.
#[inline(always)]
pub(super) fn cut(bytes: Bytes16, ctrl: Bytes16, shifts: LaneShifts, mask: Codes) -> Codes {
    let windows = i8x16_swizzle(bytes, ctrl);
    v128_and(u16x8_shr(i16x8_mul(windows, shifts), 8), mask)
}

/// The int16 levels of two groups' codes (each below 16) in `table`, 16 int8 levels.
#[inline(always)]
pub(super) fn levels16(table: Bytes16, a: Codes, b: Codes) -> (Levels8, Levels8) {
    // Codes are below 16: narrowing keeps them, and each is its level's index.
    let bytes = i8x16_swizzle(table, u8x16_narrow_i16x8(a, b));
    (i16x8_extend_low_i8x16(bytes), i16x8_extend_high_i8x16(bytes))
}

/// One segment's constants in registers.
#[derive(Clone, Copy)]
pub(super) struct SegmentPlan {
    pub(super) seg: Segment,
    ctrl: Bytes16,
    shifts: LaneShifts,
    mask: Codes,
    /// Levels 0..16 as four 16-byte chunks (zero-padded), and how many chunks the width needs.
    bytes: [v128; 4],
    chunks: usize,
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
            let p = padded.as_ptr() as *const v128;
            SegmentPlan {
                seg,
                ctrl: v128_load(ctrl.as_ptr() as *const v128),
                shifts: lane_shifts(shift),
                mask: code_mask(seg.width),
                bytes: [
                    v128_load(p),
                    v128_load(p.add(1)),
                    v128_load(p.add(2)),
                    v128_load(p.add(3)),
                ],
                chunks: ((4usize << seg.width) / 16).clamp(1, 4),
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
                let c = u8x16_narrow_i16x8(idx, idx);
                let offsets = v128_load(BYTE_OF_F32.as_ptr() as *const v128);
                let half = |rep: &[u8; 16]| {
                    let r = i8x16_swizzle(c, v128_load(rep.as_ptr() as *const v128));
                    let byte_idx = i8x16_add(i8x16_shl(r, 2), offsets);
                    let mut v = i8x16_swizzle(self.bytes[0], byte_idx);
                    for (k, chunk) in self.bytes.iter().enumerate().take(self.chunks).skip(1) {
                        // Indices below 16·k wrap to >= 240 and select 0.
                        let shifted = i8x16_sub(byte_idx, u8x16_splat(16 * k as u8));
                        v = v128_or(v, i8x16_swizzle(*chunk, shifted));
                    }
                    v
                };
                v128_store(dst as *mut v128, half(&REP[0]));
                v128_store(dst.add(4) as *mut v128, half(&REP[1]));
            } else {
                let mut codes = [0u16; 8];
                v128_store(codes.as_mut_ptr() as *mut v128, idx);
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
    i64x2_extract_lane::<0>(u8x16_narrow_i16x8(codes, codes)).to_le_bytes()
}

/// Packs groups of 8 codes of one width into words: pairs of codes by a multiply-add, the
/// four pairs shifted into place.
pub(super) struct Packer {
    width: u32,
    keep: v128,
    mul: v128,
}

impl Packer {
    #[inline(always)]
    pub(super) unsafe fn new(width: u32) -> Self {
        let odd = 1u16 << width;
        Packer {
            width,
            keep: u16x8_splat((1u16 << width) - 1),
            mul: u16x8(1, odd, 1, odd, 1, odd, 1, odd),
        }
    }

    /// The bit stream of 8 codes (each masked to the width).
    #[inline(always)]
    pub(super) unsafe fn word(&self, eight: [u8; 8]) -> u64 {
        let c = v128_and(
            u16x8_extend_low_u8x16(u64x2_splat(u64::from_le_bytes(eight))),
            self.keep,
        );
        // Pairs of codes, 2w bits each, in 32-bit lanes.
        let pairs = u32x4_extadd_pairwise_u16x8(i16x8_mul(c, self.mul));
        let w = self.width;
        let lane = |k: u32| -> u64 {
            let v = match k {
                0 => u32x4_extract_lane::<0>(pairs),
                1 => u32x4_extract_lane::<1>(pairs),
                2 => u32x4_extract_lane::<2>(pairs),
                _ => u32x4_extract_lane::<3>(pairs),
            };
            (v as u64) << (2 * w * k)
        };
        lane(0) | lane(1) | lane(2) | lane(3)
    }
}
