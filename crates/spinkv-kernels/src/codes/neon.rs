//! NEON code unpacking and decoding, 8 codes per step: the group's `w` bytes are broadcast,
//! `tbl` puts each code's one or two bytes into its own 16-bit lane, a variable shift and a
//! mask leave the code; levels (up to 4 bits) come from a byte-table lookup of the 4 bytes of
//! each f32 level (`tbl` over up to 64 bytes), wider codes from a scalar table.

use super::{scalar, CodeLayout, Levels, Segment, WINDOWS_16};
use core::arch::aarch64::*;

/// The `n <= 8` bytes at `at` as a little-endian word (bytes above `n` unspecified).
#[inline(always)]
fn read_word(bytes: &[u8], at: usize, n: usize) -> u64 {
    debug_assert!(at + n <= bytes.len() && n <= 8);
    if at + 8 <= bytes.len() {
        u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes"))
    } else if bytes.len() >= 8 {
        let start = bytes.len() - 8;
        u64::from_le_bytes(bytes[start..].try_into().expect("8 bytes")) >> (8 * (at - start))
    } else {
        let mut word = [0u8; 8];
        word[..n].copy_from_slice(&bytes[at..at + n]);
        u64::from_le_bytes(word)
    }
}

#[inline(always)]
fn group_bytes(n: usize, width: u32) -> usize {
    (n * width as usize).div_ceil(8)
}

/// Byte indices replicating codes 0..3 (and 4..7) four times, and the byte offsets within an f32.
const REP: [[u8; 16]; 2] = [
    [0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3],
    [4, 4, 4, 4, 5, 5, 5, 5, 6, 6, 6, 6, 7, 7, 7, 7],
];
const BYTE_OF_F32: [u8; 16] = [0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3];

#[derive(Clone, Copy)]
struct SegmentPlan {
    seg: Segment,
    ctrl: uint8x16_t,
    shift: int16x8_t,
    mask: uint16x8_t,
    /// Levels 0..16 as 64 bytes (zero-padded).
    bytes: uint8x16x4_t,
    table: *const f32,
}

/// Decodes rows of a code block to levels (or to bare codes) with one layout and codebook.
pub(crate) struct RowDecoder {
    layout: CodeLayout,
    plans: Option<[SegmentPlan; 2]>,
}

impl RowDecoder {
    /// # Safety
    /// `levels` checked against `layout` and alive while the decoder is used.
    pub(crate) unsafe fn new(layout: &CodeLayout, levels: Levels<'_>) -> Self {
        let plans = layout.segments().map(|segs| {
            segs.map(|seg| {
                let (ctrl, shift) = WINDOWS_16[seg.width as usize];
                let neg: [i16; 8] = core::array::from_fn(|k| -(shift[k] as i16));
                let table = if seg.len == 0 {
                    &[][..]
                } else {
                    levels.table(layout, seg.first)
                };
                let mut padded = [0.0f32; 16];
                let n = table.len().min(16);
                padded[..n].copy_from_slice(&table[..n]);
                // SAFETY: every load reads inside the local arrays.
                unsafe {
                    let p = padded.as_ptr() as *const u8;
                    SegmentPlan {
                        seg,
                        ctrl: vld1q_u8(ctrl.as_ptr()),
                        shift: vld1q_s16(neg.as_ptr()),
                        mask: vdupq_n_u16((1u16 << seg.width) - 1),
                        bytes: uint8x16x4_t(
                            vld1q_u8(p),
                            vld1q_u8(p.add(16)),
                            vld1q_u8(p.add(32)),
                            vld1q_u8(p.add(48)),
                        ),
                        table: table.as_ptr(),
                    }
                }
            })
        });
        RowDecoder {
            layout: *layout,
            plans,
        }
    }

    /// Codes of group `g` of a segment as 16-bit lanes (lanes past its end are garbage).
    #[inline(always)]
    unsafe fn codes8(&self, plan: &SegmentPlan, bytes: &[u8], at: usize, g: usize) -> uint16x8_t {
        let w = plan.seg.width as usize;
        let n = (plan.seg.len - 8 * g).min(8);
        let word = read_word(
            bytes,
            at + plan.seg.byte + g * w,
            group_bytes(n, plan.seg.width),
        );
        let windows = vreinterpretq_u16_u8(vqtbl1q_u8(
            vreinterpretq_u8_u64(vdupq_n_u64(word)),
            plan.ctrl,
        ));
        vandq_u16(vshlq_u16(windows, plan.shift), plan.mask)
    }

    /// Levels of 8 codes, as two vectors of 4.
    #[inline(always)]
    unsafe fn lookup(plan: &SegmentPlan, idx: uint16x8_t) -> [float32x4_t; 2] {
        if plan.seg.width <= 4 {
            let c8 = vmovn_u16(idx);
            let c = vcombine_u8(c8, c8);
            let offsets = vld1q_u8(BYTE_OF_F32.as_ptr());
            let half = |rep: &[u8; 16]| {
                let r = vqtbl1q_u8(c, vld1q_u8(rep.as_ptr()));
                let byte_idx = vaddq_u8(vshlq_n_u8::<2>(r), offsets);
                vreinterpretq_f32_u8(vqtbl4q_u8(plan.bytes, byte_idx))
            };
            [half(&REP[0]), half(&REP[1])]
        } else {
            let mut codes = [0u16; 8];
            vst1q_u16(codes.as_mut_ptr(), idx);
            // SAFETY: codes are below 2^width and the table holds 2^width levels.
            let levels: [f32; 8] =
                core::array::from_fn(|k| unsafe { *plan.table.add(codes[k] as usize) });
            [
                vld1q_f32(levels.as_ptr()),
                vld1q_f32(levels.as_ptr().add(4)),
            ]
        }
    }

    /// `out[..d]` = levels of the row at byte `at` of `bytes`.
    ///
    /// # Safety
    /// `bytes[at..]` holds a packed row; `out.len() >= d`; the levels are alive.
    #[inline(always)]
    pub(crate) unsafe fn decode(
        &self,
        bytes: &[u8],
        at: usize,
        levels: Levels<'_>,
        out: &mut [f32],
    ) {
        let Some(plans) = &self.plans else {
            let row = &bytes[at..at + self.layout.bytes()];
            scalar::dequantize(row, &self.layout, levels, &mut out[..self.layout.d]);
            return;
        };
        for plan in plans {
            let len = plan.seg.len;
            let dst = &mut out[plan.seg.first..plan.seg.first + len];
            for g in 0..len.div_ceil(8) {
                // SAFETY: register work and loads inside the block (see codes8).
                let [a, b] = unsafe { Self::lookup(plan, self.codes8(plan, bytes, at, g)) };
                let n = (len - 8 * g).min(8);
                if n == 8 {
                    // SAFETY: 8 lanes g*8.. lie inside dst.
                    unsafe {
                        vst1q_f32(dst.as_mut_ptr().add(8 * g), a);
                        vst1q_f32(dst.as_mut_ptr().add(8 * g + 4), b);
                    }
                } else {
                    let mut eight = [0.0f32; 8];
                    // SAFETY: stores into the local array.
                    unsafe {
                        vst1q_f32(eight.as_mut_ptr(), a);
                        vst1q_f32(eight.as_mut_ptr().add(4), b);
                    }
                    dst[8 * g..8 * g + n].copy_from_slice(&eight[..n]);
                }
            }
        }
    }

    /// `codes[..d]` = the bare codes of the row at byte `at` of `bytes`.
    ///
    /// # Safety
    /// `bytes[at..]` holds a packed row; `codes.len() >= d`.
    pub(crate) unsafe fn unpack(&self, bytes: &[u8], at: usize, codes: &mut [u8]) {
        let Some(plans) = &self.plans else {
            let row = &bytes[at..at + self.layout.bytes()];
            scalar::unpack(row, &self.layout, &mut codes[..self.layout.d]);
            return;
        };
        for plan in plans {
            let len = plan.seg.len;
            for g in 0..len.div_ceil(8) {
                let mut eight = [0u8; 8];
                // SAFETY: register work; the store fills the local array.
                unsafe {
                    vst1_u8(
                        eight.as_mut_ptr(),
                        vmovn_u16(self.codes8(plan, bytes, at, g)),
                    )
                };
                let n = (len - 8 * g).min(8);
                let from = plan.seg.first + 8 * g;
                codes[from..from + n].copy_from_slice(&eight[..n]);
            }
        }
    }
}

/// # Safety
/// aarch64; arguments as checked by `super::pack`.
pub unsafe fn pack(codes: &[u8], layout: &CodeLayout, out: &mut [u8]) {
    let Some(segs) = layout.segments() else {
        return scalar::pack(codes, layout, out);
    };
    out.fill(0);
    for seg in segs {
        let w = seg.width as i64;
        let shifts: [int64x2_t; 4] = core::array::from_fn(|i| {
            let pair = [2 * i as i64 * w, (2 * i as i64 + 1) * w];
            // SAFETY: loads two lanes of the local array.
            unsafe { vld1q_s64(pair.as_ptr()) }
        });
        for g in 0..seg.len.div_ceil(8) {
            let n = (seg.len - 8 * g).min(8);
            let mut eight = [0u8; 8];
            eight[..n].copy_from_slice(&codes[seg.first + 8 * g..seg.first + 8 * g + n]);
            // SAFETY: register work on a local array.
            let word = unsafe {
                let c = vand_u8(vld1_u8(eight.as_ptr()), vdup_n_u8(((1u16 << w) - 1) as u8));
                let c16 = vmovl_u8(c);
                let (c32a, c32b) = (vmovl_u16(vget_low_u16(c16)), vmovl_high_u16(c16));
                let quads = [
                    vmovl_u32(vget_low_u32(c32a)),
                    vmovl_high_u32(c32a),
                    vmovl_u32(vget_low_u32(c32b)),
                    vmovl_high_u32(c32b),
                ];
                let mut acc = vdupq_n_u64(0);
                for (q, s) in quads.iter().zip(&shifts) {
                    acc = vorrq_u64(acc, vshlq_u64(*q, *s));
                }
                vgetq_lane_u64::<0>(acc) | vgetq_lane_u64::<1>(acc)
            };
            let at = seg.byte + g * w as usize;
            let nb = group_bytes(n, seg.width);
            out[at..at + nb].copy_from_slice(&word.to_le_bytes()[..nb]);
        }
    }
}

/// # Safety
/// aarch64; arguments as checked by `super::unpack`.
pub unsafe fn unpack(bytes: &[u8], layout: &CodeLayout, codes: &mut [u8]) {
    let none = [0.0f32; 256];
    let levels = Levels {
        hi: &none,
        lo: &none,
    };
    // SAFETY: the decoder reads only the row's bytes.
    unsafe { RowDecoder::new(layout, levels).unpack(&bytes[..layout.bytes()], 0, codes) }
}

/// # Safety
/// aarch64; arguments as checked by `super::dequantize`.
pub unsafe fn dequantize(bytes: &[u8], layout: &CodeLayout, levels: Levels<'_>, out: &mut [f32]) {
    let stride = layout.bytes();
    // SAFETY: rows lie inside `bytes` (checked by the caller).
    unsafe {
        let decoder = RowDecoder::new(layout, levels);
        for (j, row) in out.chunks_exact_mut(layout.d).enumerate() {
            decoder.decode(bytes, j * stride, levels, row);
        }
    }
}
