//! WASM SIMD128 code unpacking and decoding, 8 codes per step: the group's `w` bytes are
//! broadcast, a swizzle puts each code's one or two bytes into its own 16-bit lane, a
//! per-lane multiply and a shift leave the code (SIMD128 has no per-lane shift); levels (up to
//! 4 bits) come from swizzles of the levels' bytes, wider codes from a scalar table.

use super::{scalar, CodeLayout, Levels, Segment, WINDOWS_16};
use core::arch::wasm32::*;

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

const REP: [[u8; 16]; 2] = [
    [0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3],
    [4, 4, 4, 4, 5, 5, 5, 5, 6, 6, 6, 6, 7, 7, 7, 7],
];
const BYTE_OF_F32: [u8; 16] = [0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3];

#[derive(Clone, Copy)]
struct SegmentPlan {
    seg: Segment,
    ctrl: v128,
    /// `2^(8 - shift)` per 16-bit lane: multiply, then shift every lane right by 8.
    mul: v128,
    mask: v128,
    /// Levels 0..16 as four 16-byte chunks (zero-padded), and how many chunks the width needs.
    bytes: [v128; 4],
    chunks: usize,
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
                let mul: [u16; 8] = core::array::from_fn(|k| 1u16 << (8 - shift[k]));
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
                    let p = padded.as_ptr() as *const v128;
                    SegmentPlan {
                        seg,
                        ctrl: v128_load(ctrl.as_ptr() as *const v128),
                        mul: v128_load(mul.as_ptr() as *const v128),
                        mask: u16x8_splat((1u16 << seg.width) - 1),
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
            })
        });
        RowDecoder {
            layout: *layout,
            plans,
        }
    }

    /// Codes of group `g` of a segment as 16-bit lanes (lanes past its end are garbage).
    #[inline(always)]
    fn codes8(&self, plan: &SegmentPlan, bytes: &[u8], at: usize, g: usize) -> v128 {
        let w = plan.seg.width as usize;
        let n = (plan.seg.len - 8 * g).min(8);
        let word = read_word(
            bytes,
            at + plan.seg.byte + g * w,
            group_bytes(n, plan.seg.width),
        );
        let windows = i8x16_swizzle(u64x2_splat(word), plan.ctrl);
        v128_and(u16x8_shr(i16x8_mul(windows, plan.mul), 8), plan.mask)
    }

    /// Levels of 8 codes, as two vectors of 4.
    #[inline(always)]
    fn lookup(plan: &SegmentPlan, idx: v128) -> [v128; 2] {
        if plan.seg.width <= 4 {
            let c = u8x16_narrow_i16x8(idx, idx);
            // SAFETY: loads of constant arrays.
            let offsets = unsafe { v128_load(BYTE_OF_F32.as_ptr() as *const v128) };
            let half = |rep: &[u8; 16]| {
                // SAFETY: load of a constant array.
                let r = i8x16_swizzle(c, unsafe { v128_load(rep.as_ptr() as *const v128) });
                let byte_idx = i8x16_add(i8x16_shl(r, 2), offsets);
                let mut v = i8x16_swizzle(plan.bytes[0], byte_idx);
                for (k, chunk) in plan.bytes.iter().enumerate().take(plan.chunks).skip(1) {
                    // Indices below 16·k wrap to >= 240 and select 0.
                    let shifted = i8x16_sub(byte_idx, u8x16_splat(16 * k as u8));
                    v = v128_or(v, i8x16_swizzle(*chunk, shifted));
                }
                v
            };
            [half(&REP[0]), half(&REP[1])]
        } else {
            // SAFETY: codes are below 2^width and the table holds 2^width levels.
            let level =
                |k: usize| unsafe { *plan.table.add(u16x8_extract_lane_dyn(idx, k) as usize) };
            [
                f32x4(level(0), level(1), level(2), level(3)),
                f32x4(level(4), level(5), level(6), level(7)),
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
                let [a, b] = Self::lookup(plan, self.codes8(plan, bytes, at, g));
                let n = (len - 8 * g).min(8);
                if n == 8 {
                    // SAFETY: 8 lanes g*8.. lie inside dst.
                    unsafe {
                        v128_store(dst.as_mut_ptr().add(8 * g) as *mut v128, a);
                        v128_store(dst.as_mut_ptr().add(8 * g + 4) as *mut v128, b);
                    }
                } else {
                    let mut eight = [0.0f32; 8];
                    // SAFETY: stores into the local array.
                    unsafe {
                        v128_store(eight.as_mut_ptr() as *mut v128, a);
                        v128_store(eight.as_mut_ptr().add(4) as *mut v128, b);
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
                let c = self.codes8(plan, bytes, at, g);
                let eight = i64x2_extract_lane::<0>(u8x16_narrow_i16x8(c, c)).to_le_bytes();
                let n = (len - 8 * g).min(8);
                let from = plan.seg.first + 8 * g;
                codes[from..from + n].copy_from_slice(&eight[..n]);
            }
        }
    }
}

/// Lane `k` of a u16x8 with a run-time index.
#[inline(always)]
fn u16x8_extract_lane_dyn(v: v128, k: usize) -> u16 {
    let mut lanes = [0u16; 8];
    // SAFETY: stores 16 bytes into a 16-byte local array.
    unsafe { v128_store(lanes.as_mut_ptr() as *mut v128, v) };
    lanes[k]
}

/// # Safety
/// Arguments as checked by `super::pack`.
pub unsafe fn pack(codes: &[u8], layout: &CodeLayout, out: &mut [u8]) {
    let Some(segs) = layout.segments() else {
        return scalar::pack(codes, layout, out);
    };
    out.fill(0);
    for seg in segs {
        let w = seg.width;
        let keep = u16x8_splat((1u16 << w) - 1);
        let odd = 1u16 << w;
        let mul = u16x8(1, odd, 1, odd, 1, odd, 1, odd);
        for g in 0..seg.len.div_ceil(8) {
            let n = (seg.len - 8 * g).min(8);
            let mut eight = [0u8; 8];
            eight[..n].copy_from_slice(&codes[seg.first + 8 * g..seg.first + 8 * g + n]);
            let c = v128_and(
                u16x8_extend_low_u8x16(u64x2_splat(u64::from_le_bytes(eight))),
                keep,
            );
            // Pairs of codes, 2w bits each, in 32-bit lanes.
            let pairs = u32x4_extadd_pairwise_u16x8(i16x8_mul(c, mul));
            let lane = |k: u32| -> u64 {
                let v = match k {
                    0 => u32x4_extract_lane::<0>(pairs),
                    1 => u32x4_extract_lane::<1>(pairs),
                    2 => u32x4_extract_lane::<2>(pairs),
                    _ => u32x4_extract_lane::<3>(pairs),
                };
                (v as u64) << (2 * w * k)
            };
            let word = lane(0) | lane(1) | lane(2) | lane(3);
            let at = seg.byte + g * w as usize;
            let nb = group_bytes(n, w);
            out[at..at + nb].copy_from_slice(&word.to_le_bytes()[..nb]);
        }
    }
}

/// # Safety
/// Arguments as checked by `super::unpack`.
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
/// Arguments as checked by `super::dequantize`.
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
