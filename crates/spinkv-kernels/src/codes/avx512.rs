//! AVX-512 code unpacking and decoding, 16 codes per step (head dims up to 256; larger ones
//! and layouts whose second segment does not start on a byte go through the scalar decoder): the group's `2w` bytes come in with
//! a masked load (never past the block), are broadcast to the four 128-bit lanes, a byte
//! shuffle puts each code's bytes into its own 32-bit lane, a variable shift and a mask leave
//! the code; levels come from `vpermps` (up to 4 bits: one 16-entry table), `vpermt2ps`
//! (5 bits) or a gather (6..8 bits).

use super::windows::{group_bytes, WINDOWS_32};
use super::{scalar, CodeLayout, Levels, Segment};
use crate::simd::avx512::tail_mask;
use std::arch::x86_64::*;

/// Head dims up to this decode group by group; larger ones through the scalar decoder.
pub(crate) const MAX_PLANNED_DIM: usize = 1024;

/// One segment's constants in registers: how to cut its codes out, how to look them up.
#[derive(Clone, Copy)]
struct SegmentPlan {
    width: u32,
    ctrl: __m512i,
    shift: __m512i,
    mask: __m512i,
    /// Entries 0..16 and 16..32 of the lookup table: for widths up to 5 the `2^width` levels
    /// repeated, so an index's bits above the width select the same level (no masking needed).
    t0: __m512,
    t1: __m512,
    table: *const f32,
}

/// Decodes rows of a code block to levels (or to bare codes) with one layout and codebook.
/// Small on purpose (built per page call): the vector constants are loaded per segment when
/// a call starts decoding, from the static window tables and the level tables.
pub(crate) struct RowDecoder {
    layout: CodeLayout,
    segs: Option<[Segment; 2]>,
    tables: [*const f32; 2],
    table_lens: [usize; 2],
}

impl RowDecoder {
    /// `levels` must be checked against `layout` and outlive the decoder.
    #[inline]
    pub(crate) fn new(layout: &CodeLayout, levels: Levels<'_>) -> Self {
        let segs = layout.segments().filter(|_| layout.d <= MAX_PLANNED_DIM);
        let table = |i: usize| match segs {
            Some(s) if s[i].len > 0 => levels.table(layout, s[i].first),
            _ => &[][..],
        };
        let (t0, t1) = (table(0), table(1));
        RowDecoder {
            layout: *layout,
            segs,
            tables: [t0.as_ptr(), t1.as_ptr()],
            table_lens: [t0.len(), t1.len()],
        }
    }

    /// Whether rows decode group by group (otherwise through the scalar decoder).
    pub(crate) fn has_segments(&self) -> bool {
        self.segs.is_some()
    }

    /// The constants of segment `i`.
    ///
    /// # Safety
    /// AVX-512; the level tables are alive.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    unsafe fn plan(&self, i: usize, seg: &Segment) -> SegmentPlan {
        let (ctrl, shift) = &WINDOWS_32[seg.width as usize];
        let (table, len) = (self.tables[i], self.table_lens[i]);
        let (n0, n1) = (len.min(16), len.clamp(16, 32) - 16);
        let mask = _mm512_set1_epi32((1i32 << seg.width) - 1);
        // SAFETY: the window tables are 64 bytes long; the masked loads stay inside the level
        // table (`len` entries), which the caller keeps alive.
        unsafe {
            let (mut t0, mut t1) = (
                _mm512_maskz_loadu_ps(tail_mask(n0), table),
                _mm512_maskz_loadu_ps(tail_mask(n1), table.wrapping_add(16)),
            );
            if seg.width <= 5 {
                // `len >= 2^width` (checked levels): repeat the first 2^width entries.
                let iota = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
                let low = _mm512_and_si512(iota, mask);
                let high = _mm512_and_si512(_mm512_add_epi32(iota, _mm512_set1_epi32(16)), mask);
                (t0, t1) = (
                    _mm512_permutex2var_ps(t0, low, t1),
                    _mm512_permutex2var_ps(t0, high, t1),
                );
            }
            SegmentPlan {
                width: seg.width,
                ctrl: _mm512_loadu_si512(ctrl.as_ptr() as *const __m512i),
                shift: _mm512_loadu_si512(shift.as_ptr() as *const __m512i),
                mask,
                t0,
                t1,
                table,
            }
        }
    }

    /// The codes of the group of `n` codes whose bytes start at `src`, as 32-bit lanes (lanes
    /// past `n` are garbage).
    ///
    /// # Safety
    /// AVX-512; the group's bytes are readable.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    unsafe fn codes16(plan: &SegmentPlan, src: *const u8, n: usize) -> __m512i {
        // SAFETY: as `shifted16`.
        _mm512_and_si512(unsafe { Self::shifted16(plan, src, n) }, plan.mask)
    }

    /// As `codes16`, but each lane's bits above the code's width are left as they come (bits
    /// of the next codes).
    ///
    /// # Safety
    /// AVX-512; the group's bytes are readable.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    unsafe fn shifted16(plan: &SegmentPlan, src: *const u8, n: usize) -> __m512i {
        // SAFETY: the mask covers exactly the group's bytes.
        let raw = unsafe {
            _mm_maskz_loadu_epi8(tail_mask(group_bytes(n, plan.width)), src as *const i8)
        };
        let windows = _mm512_shuffle_epi8(_mm512_broadcast_i32x4(raw), plan.ctrl);
        _mm512_srlv_epi32(windows, plan.shift)
    }

    /// Levels of the 16 codes whose bits start each lane of `shifted` (`shifted16`).
    ///
    /// # Safety
    /// AVX-512; the level tables are alive.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    unsafe fn lookup(plan: &SegmentPlan, shifted: __m512i) -> __m512 {
        if plan.width <= 5 {
            // One 32-entry lookup of the repeated levels covers every width up to 5: it reads
            // the low 5 bits of each lane, and the repetition makes the bits above the width
            // irrelevant.
            _mm512_permutex2var_ps(plan.t0, shifted, plan.t1)
        } else {
            let idx = _mm512_and_si512(shifted, plan.mask);
            // SAFETY: codes are below 2^width and the table holds 2^width levels.
            unsafe { _mm512_i32gather_ps::<4>(idx, plan.table) }
        }
    }

    /// Writes the levels of `n_rows` rows, the first at byte `at`, `row_bytes` apart, to
    /// `dst` (row `t` at `dst + t·stride`, channels `0..d`, nothing else written). Segment by
    /// segment, so each segment's shuffle/shift/lookup constants stay in registers.
    ///
    /// # Safety
    /// AVX-512; the layout is planned (`has_segments`); the rows lie inside `bytes`; `dst`
    /// valid for `n_rows` rows of `stride >= d` floats; the level tables are alive.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    pub(crate) unsafe fn decode_rows(
        &self,
        bytes: &[u8],
        at: usize,
        row_bytes: usize,
        n_rows: usize,
        dst: *mut f32,
        stride: usize,
    ) {
        let Some(segs) = &self.segs else {
            return;
        };
        assert!(n_rows == 0 || at + (n_rows - 1) * row_bytes + self.layout.bytes() <= bytes.len());
        for (i, seg) in segs.iter().enumerate() {
            if seg.len == 0 {
                continue;
            }
            // SAFETY: same target features; tables alive (caller).
            let plan = unsafe { self.plan(i, seg) };
            let step = 2 * seg.width as usize;
            let (full, rem) = (seg.len / 16, seg.len % 16);
            for t in 0..n_rows {
                // SAFETY: row t's segment bytes lie inside `bytes` (checked above), its
                // channels inside the destination row (the caller's contract).
                unsafe {
                    let src = bytes.as_ptr().add(at + t * row_bytes + seg.byte);
                    let out = dst.add(t * stride + seg.first);
                    for g in 0..full {
                        let v = Self::lookup(&plan, Self::shifted16(&plan, src.add(g * step), 16));
                        _mm512_storeu_ps(out.add(16 * g), v);
                    }
                    if rem > 0 {
                        let shifted = Self::shifted16(&plan, src.add(full * step), rem);
                        let v = Self::lookup(&plan, shifted);
                        _mm512_mask_storeu_ps(out.add(16 * full), tail_mask(rem), v);
                    }
                }
            }
        }
    }

    /// `out[..d]` = levels of the row at byte `at` of `bytes`.
    ///
    /// # Safety
    /// AVX-512; the level tables are alive.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    pub(crate) unsafe fn decode(
        &self,
        bytes: &[u8],
        at: usize,
        levels: Levels<'_>,
        out: &mut [f32],
    ) {
        let d = self.layout.d;
        assert!(at + self.layout.bytes() <= bytes.len() && out.len() >= d);
        if self.has_segments() {
            // SAFETY: the row and out[..d] are in bounds (checked above).
            unsafe { self.decode_rows(bytes, at, 0, 1, out.as_mut_ptr(), d) };
        } else {
            let row = &bytes[at..at + self.layout.bytes()];
            scalar::dequantize(row, &self.layout, levels, &mut out[..d]);
        }
    }

    /// `codes[..d]` = the bare codes of the row at byte `at` of `bytes`.
    ///
    /// # Safety
    /// AVX-512.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    pub(crate) unsafe fn unpack(&self, bytes: &[u8], at: usize, codes: &mut [u8]) {
        let d = self.layout.d;
        assert!(at + self.layout.bytes() <= bytes.len() && codes.len() >= d);
        let Some(segs) = &self.segs else {
            let row = &bytes[at..at + self.layout.bytes()];
            scalar::unpack(row, &self.layout, &mut codes[..d]);
            return;
        };
        for (i, seg) in segs.iter().enumerate() {
            if seg.len == 0 {
                continue;
            }
            // SAFETY: same target features; unpacking reads no level table.
            let plan = unsafe { self.plan(i, seg) };
            let step = 2 * seg.width as usize;
            for g in 0..seg.len.div_ceil(16) {
                let n = (seg.len - 16 * g).min(16);
                // SAFETY: the group's bytes lie inside the row (checked); the mask covers
                // codes[first..first + n].
                unsafe {
                    let src = bytes.as_ptr().add(at + seg.byte + g * step);
                    let v = _mm512_cvtepi32_epi8(Self::codes16(&plan, src, n));
                    let dst = codes.as_mut_ptr().add(seg.first + 16 * g) as *mut i8;
                    _mm_mask_storeu_epi8(dst, tail_mask(n), v);
                }
            }
        }
    }
}

/// # Safety
/// CPU must support AVX-512 F/BW/VL; arguments as checked by `super::pack`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
pub unsafe fn pack(codes: &[u8], layout: &CodeLayout, out: &mut [u8]) {
    let Some(segs) = layout.segments() else {
        return scalar::pack(codes, layout, out);
    };
    out.fill(0);
    for seg in segs {
        let w = seg.width as i64;
        let keep = _mm512_set1_epi64((1i64 << w) - 1);
        let shifts = _mm512_setr_epi64(0, w, 2 * w, 3 * w, 4 * w, 5 * w, 6 * w, 7 * w);
        for g in 0..seg.len.div_ceil(8) {
            let n = (seg.len - 8 * g).min(8);
            let from = seg.first + 8 * g;
            // SAFETY: the mask covers codes[from..from + n], inside `codes`.
            let raw = unsafe {
                _mm_maskz_loadu_epi8(tail_mask(n), codes.as_ptr().add(from) as *const i8)
            };
            let lanes = _mm512_and_si512(_mm512_cvtepu8_epi64(raw), keep);
            let word = _mm512_reduce_or_epi64(_mm512_sllv_epi64(lanes, shifts)) as u64;
            let at = seg.byte + g * w as usize;
            let nb = group_bytes(n, seg.width);
            out[at..at + nb].copy_from_slice(&word.to_le_bytes()[..nb]);
        }
    }
}

/// # Safety
/// CPU must support AVX-512 F/BW/VL; arguments as checked by `super::unpack`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
pub unsafe fn unpack(bytes: &[u8], layout: &CodeLayout, codes: &mut [u8]) {
    let none = [0.0f32; 256];
    let levels = Levels {
        hi: &none,
        lo: &none,
    };
    // SAFETY: same target features; the decoder reads only the row's bytes.
    unsafe { RowDecoder::new(layout, levels).unpack(&bytes[..layout.bytes()], 0, codes) }
}

/// # Safety
/// CPU must support AVX-512 F/BW/VL; arguments as checked by `super::dequantize`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
pub unsafe fn dequantize(bytes: &[u8], layout: &CodeLayout, levels: Levels<'_>, out: &mut [f32]) {
    let stride = layout.bytes();
    // SAFETY: same target features; rows lie inside `bytes` (checked by the caller).
    unsafe {
        let decoder = RowDecoder::new(layout, levels);
        for (j, row) in out.chunks_exact_mut(layout.d).enumerate() {
            decoder.decode(bytes, j * stride, levels, row);
        }
    }
}
