//! NEON / SIMD128 code packing, unpacking and decoding, 8 codes per step, one body for both
//! 4-lane ISAs. The group's `w` bytes are read as one word; the ISA file (`neon.rs` or
//! `simd128.rs`, mounted here as `isa`) cuts the 8 codes out of it, looks their levels up and
//! packs 8 codes into a word. The integer scans cut rows to int16 levels with [`CutPlan`]
//! (`cut128.rs`), on the same ISA files.

use super::windows::{group_bytes, read_word};
use super::{scalar, CodeLayout, Levels};

#[cfg(target_arch = "aarch64")]
#[path = "neon.rs"]
mod isa;
#[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
#[path = "simd128.rs"]
mod isa;

use isa::SegmentPlan;

#[path = "cut128.rs"]
mod cut128;
pub(crate) use cut128::Plan as CutPlan;
pub(crate) use isa::{zero_levels8, Levels8};

/// For the table lookups of levels (`SegmentPlan::levels8`): byte indices replicating codes
/// 0..3 (and 4..7) four times, and the byte offsets within an f32.
const REP: [[u8; 16]; 2] = [
    [0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3],
    [4, 4, 4, 4, 5, 5, 5, 5, 6, 6, 6, 6, 7, 7, 7, 7],
];
const BYTE_OF_F32: [u8; 16] = [0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3];

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
                let table = if seg.len == 0 {
                    &[][..]
                } else {
                    levels.table(layout, seg.first)
                };
                // SAFETY: the caller keeps the levels alive while the decoder is used.
                unsafe { SegmentPlan::new(seg, table) }
            })
        });
        RowDecoder {
            layout: *layout,
            plans,
        }
    }

    /// Codes of group `g` of a segment (lanes past its end are garbage).
    #[inline(always)]
    fn codes8(plan: &SegmentPlan, bytes: &[u8], at: usize, g: usize) -> isa::Codes {
        let w = plan.seg.width as usize;
        let n = (plan.seg.len - 8 * g).min(8);
        let word = read_word(
            bytes,
            at + plan.seg.byte + g * w,
            group_bytes(n, plan.seg.width),
        );
        // SAFETY: register work only.
        unsafe { plan.codes_of(word) }
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
                let codes = Self::codes8(plan, bytes, at, g);
                let n = (len - 8 * g).min(8);
                if n == 8 {
                    // SAFETY: 8 lanes g*8.. lie inside dst; codes index the live table.
                    unsafe { plan.levels8(codes, dst.as_mut_ptr().add(8 * g)) };
                } else {
                    let mut eight = [0.0f32; 8];
                    // SAFETY: stores into the local array; codes index the live table.
                    unsafe { plan.levels8(codes, eight.as_mut_ptr()) };
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
                // SAFETY: register work only.
                let eight = unsafe { isa::narrow8(Self::codes8(plan, bytes, at, g)) };
                let n = (len - 8 * g).min(8);
                let from = plan.seg.first + 8 * g;
                codes[from..from + n].copy_from_slice(&eight[..n]);
            }
        }
    }
}

/// # Safety
/// NEON or SIMD128 (whichever this build has); arguments as checked by `super::pack`.
pub unsafe fn pack(codes: &[u8], layout: &CodeLayout, out: &mut [u8]) {
    let Some(segs) = layout.segments() else {
        return scalar::pack(codes, layout, out);
    };
    out.fill(0);
    for seg in segs {
        // SAFETY: register work only.
        let packer = unsafe { isa::Packer::new(seg.width) };
        for g in 0..seg.len.div_ceil(8) {
            let n = (seg.len - 8 * g).min(8);
            let mut eight = [0u8; 8];
            eight[..n].copy_from_slice(&codes[seg.first + 8 * g..seg.first + 8 * g + n]);
            // SAFETY: register work only.
            let word = unsafe { packer.word(eight) };
            let at = seg.byte + g * seg.width as usize;
            let nb = group_bytes(n, seg.width);
            out[at..at + nb].copy_from_slice(&word.to_le_bytes()[..nb]);
        }
    }
}

/// # Safety
/// NEON or SIMD128; arguments as checked by `super::unpack`.
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
/// NEON or SIMD128; arguments as checked by `super::dequantize`.
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
