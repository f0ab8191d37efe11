//! AVX2 code unpacking and decoding, 8 codes per step: the group's `w` bytes are broadcast,
//! a byte shuffle puts each code's one or two bytes into its own 32-bit lane, a variable shift
//! and a mask leave the code; levels come from `vpermps` (up to 3 bits: one 8-entry table;
//! 4 bits: two tables and a blend on bit 3) or a gather (5..8 bits).

use super::windows::{group_bytes, read_word, WINDOWS_32};
use super::{scalar, CodeLayout, Levels, Segment};
use crate::simd::avx2::tail_mask;
use std::arch::x86_64::*;

/// One segment's constants in registers: how to cut its codes out, how to look them up.
#[derive(Clone, Copy)]
struct SegmentPlan {
    seg: Segment,
    ctrl: __m256i,
    /// `ctrl` for the next group of 8 codes, `w` bytes further on (zeroing entries kept).
    ctrl_next: __m256i,
    shift: __m256i,
    mask: __m256i,
    /// Levels 0..8 and 8..16 (zero past the table's end).
    t0: __m256,
    t1: __m256,
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
        let segs = layout.segments();
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
    /// AVX2; the level tables are alive.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn plan(&self, i: usize, seg: &Segment) -> SegmentPlan {
        let (ctrl, shift) = &WINDOWS_32[seg.width as usize];
        let (table, len) = (self.tables[i], self.table_lens[i]);
        let (n0, n1) = (len.min(8), len.clamp(8, 16) - 8);
        // SAFETY: the window tables are 64 bytes long; the masked loads stay inside the level
        // table (`len` entries), which the caller keeps alive.
        unsafe {
            SegmentPlan {
                seg: *seg,
                ctrl: _mm256_loadu_si256(ctrl.as_ptr() as *const __m256i),
                ctrl_next: {
                    let c = _mm256_loadu_si256(ctrl.as_ptr() as *const __m256i);
                    let keep = _mm256_cmpeq_epi8(c, _mm256_set1_epi8(0x80u8 as i8));
                    let moved = _mm256_add_epi8(c, _mm256_set1_epi8(seg.width as i8));
                    _mm256_blendv_epi8(moved, c, keep)
                },
                shift: _mm256_loadu_si256(shift.as_ptr() as *const __m256i),
                mask: _mm256_set1_epi32((1i32 << seg.width) - 1),
                t0: _mm256_maskload_ps(table, tail_mask(n0)),
                t1: _mm256_maskload_ps(table.wrapping_add(8), tail_mask(n1)),
                table,
            }
        }
    }

    /// Codes of the group of `n` codes at byte `at` of `bytes`, as 32-bit lanes (lanes past
    /// `n` are garbage).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn codes8(plan: &SegmentPlan, bytes: &[u8], at: usize, n: usize) -> __m256i {
        Self::codes_of(plan, read_word(bytes, at, group_bytes(n, plan.seg.width)))
    }

    /// The 8 codes packed at the bottom of `word`, as 32-bit lanes.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn codes_of(plan: &SegmentPlan, word: u64) -> __m256i {
        let windows = _mm256_shuffle_epi8(_mm256_set1_epi64x(word as i64), plan.ctrl);
        _mm256_and_si256(_mm256_srlv_epi32(windows, plan.shift), plan.mask)
    }

    /// Levels of 8 codes.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn lookup(plan: &SegmentPlan, idx: __m256i) -> __m256 {
        match plan.seg.width {
            1..=3 => _mm256_permutevar8x32_ps(plan.t0, idx),
            4 => {
                let lo = _mm256_permutevar8x32_ps(plan.t0, idx);
                let hi = _mm256_permutevar8x32_ps(plan.t1, idx);
                // Bit 3 of the code, moved to the sign bit, picks the upper table.
                _mm256_blendv_ps(lo, hi, _mm256_castsi256_ps(_mm256_slli_epi32::<28>(idx)))
            }
            // SAFETY: codes are below 2^width and the table holds 2^width levels.
            _ => unsafe { _mm256_i32gather_ps::<4>(plan.table, idx) },
        }
    }

    /// Writes the levels of `n_rows` rows, the first at byte `at`, `row_bytes` apart, to
    /// `dst` (row `t` at `dst + t·stride`, channels `0..d`, nothing else written). Segment by
    /// segment, so each segment's shuffle/shift/lookup constants stay in registers.
    ///
    /// # Safety
    /// AVX2; the rows lie inside `bytes` (reads are bounds-checked); `dst` valid for `n_rows`
    /// rows of `stride >= d` floats; the level tables are alive; the layout is planned.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
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
        for (i, seg) in segs.iter().enumerate() {
            if seg.len == 0 {
                continue;
            }
            // SAFETY: same target features; tables alive (caller).
            let plan = unsafe { self.plan(i, seg) };
            let w = seg.width as usize;
            let (full, rem) = (seg.len / 8, seg.len % 8);
            let rem_mask = tail_mask(rem);
            // Rows whose every group can be read as a whole 8-byte word without leaving
            // `bytes` (all but the block's last row or two) skip the bounds-checked reader.
            let span = seg.byte + full.max(1) * w + 8;
            let fast_rows = if at + span <= bytes.len() {
                ((bytes.len() - at - span) / row_bytes.max(1) + 1).min(n_rows)
            } else {
                0
            };
            // Likewise for 16-byte loads of group pairs.
            let pair_span = seg.byte + full.max(1) * w + 16;
            let fast_pair_rows = if at + pair_span <= bytes.len() {
                ((bytes.len() - at - pair_span) / row_bytes.max(1) + 1).min(n_rows)
            } else {
                0
            };
            for t in 0..n_rows {
                let row = at + t * row_bytes + seg.byte;
                // SAFETY: row t's channels lie inside the destination row (the caller's
                // contract); fast pair rows read 16 bytes at row + g·w + 16 <= bytes.len()
                // (see `pair_span`), fast rows read 8 bytes at row + g·w + 8 <= bytes.len() (see
                // `span`), the others go through read_word, which stays inside `bytes`.
                unsafe {
                    let out = dst.add(t * stride + seg.first);
                    let src = bytes.as_ptr().add(row);
                    let mut g = 0;
                    if t < fast_pair_rows {
                        // Two groups (2w <= 16 bytes) per 16-byte broadcast load.
                        while g + 2 <= full {
                            let v = _mm256_broadcastsi128_si256(_mm_loadu_si128(
                                src.add(g * w) as *const __m128i
                            ));
                            let a = _mm256_shuffle_epi8(v, plan.ctrl);
                            let b = _mm256_shuffle_epi8(v, plan.ctrl_next);
                            let a = _mm256_and_si256(_mm256_srlv_epi32(a, plan.shift), plan.mask);
                            let b = _mm256_and_si256(_mm256_srlv_epi32(b, plan.shift), plan.mask);
                            _mm256_storeu_ps(out.add(8 * g), Self::lookup(&plan, a));
                            _mm256_storeu_ps(out.add(8 * g + 8), Self::lookup(&plan, b));
                            g += 2;
                        }
                    }
                    while g < full {
                        let word = if t < fast_rows {
                            core::ptr::read_unaligned(src.add(g * w) as *const u64)
                        } else {
                            read_word(bytes, row + g * w, w)
                        };
                        let v = Self::lookup(&plan, Self::codes_of(&plan, word));
                        _mm256_storeu_ps(out.add(8 * g), v);
                        g += 1;
                    }
                    if rem > 0 {
                        let v =
                            Self::lookup(&plan, Self::codes8(&plan, bytes, row + full * w, rem));
                        _mm256_maskstore_ps(out.add(8 * full), rem_mask, v);
                    }
                }
            }
        }
    }

    /// `out[..d]` = levels of the row at byte `at` of `bytes`.
    ///
    /// # Safety
    /// AVX2; the level tables are alive.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
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
    /// AVX2.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(crate) unsafe fn unpack(&self, bytes: &[u8], at: usize, codes: &mut [u8]) {
        let d = self.layout.d;
        assert!(at + self.layout.bytes() <= bytes.len() && codes.len() >= d);
        let Some(segs) = &self.segs else {
            let row = &bytes[at..at + self.layout.bytes()];
            scalar::unpack(row, &self.layout, &mut codes[..d]);
            return;
        };
        // Byte 0 of each 32-bit lane, per 128-bit half.
        let gather = _mm256_setr_epi8(
            0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, 0, 4, 8, 12, -1, -1, -1,
            -1, -1, -1, -1, -1, -1, -1, -1, -1,
        );
        for (i, seg) in segs.iter().enumerate() {
            if seg.len == 0 {
                continue;
            }
            // SAFETY: same target features; unpacking reads no level table.
            let plan = unsafe { self.plan(i, seg) };
            let w = seg.width as usize;
            for g in 0..seg.len.div_ceil(8) {
                let n = (seg.len - 8 * g).min(8);
                let c = Self::codes8(&plan, bytes, at + seg.byte + g * w, n);
                let v = _mm256_shuffle_epi8(c, gather);
                let lo = _mm_cvtsi128_si32(_mm256_castsi256_si128(v)) as u32 as u64;
                let hi = _mm_cvtsi128_si32(_mm256_extracti128_si256::<1>(v)) as u32 as u64;
                let from = seg.first + 8 * g;
                codes[from..from + n].copy_from_slice(&(lo | hi << 32).to_le_bytes()[..n]);
            }
        }
    }
}

/// # Safety
/// CPU must support AVX2+FMA+F16C; arguments as checked by `super::pack`.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn pack(codes: &[u8], layout: &CodeLayout, out: &mut [u8]) {
    let Some(segs) = layout.segments() else {
        return scalar::pack(codes, layout, out);
    };
    out.fill(0);
    for seg in segs {
        let w = seg.width as usize;
        let keep = _mm256_set1_epi64x((1i64 << w) - 1);
        let w64 = w as i64;
        let shifts_lo = _mm256_setr_epi64x(0, w64, 2 * w64, 3 * w64);
        let shifts_hi = _mm256_setr_epi64x(4 * w64, 5 * w64, 6 * w64, 7 * w64);
        for g in 0..seg.len.div_ceil(8) {
            let n = (seg.len - 8 * g).min(8);
            let mut eight = [0u8; 8];
            eight[..n].copy_from_slice(&codes[seg.first + 8 * g..seg.first + 8 * g + n]);
            let raw = _mm_cvtsi64_si128(u64::from_le_bytes(eight) as i64);
            let a = _mm256_and_si256(_mm256_cvtepu8_epi64(raw), keep);
            let b = _mm256_and_si256(_mm256_cvtepu8_epi64(_mm_srli_si128::<4>(raw)), keep);
            let v = _mm256_or_si256(
                _mm256_sllv_epi64(a, shifts_lo),
                _mm256_sllv_epi64(b, shifts_hi),
            );
            let v = _mm_or_si128(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
            let word = (_mm_cvtsi128_si64(v) | _mm_extract_epi64::<1>(v)) as u64;
            let at = seg.byte + g * w;
            let nb = group_bytes(n, seg.width);
            out[at..at + nb].copy_from_slice(&word.to_le_bytes()[..nb]);
        }
    }
}

/// # Safety
/// CPU must support AVX2+FMA+F16C; arguments as checked by `super::unpack`.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn unpack(bytes: &[u8], layout: &CodeLayout, codes: &mut [u8]) {
    let none = [0.0f32; 256];
    let levels = Levels {
        hi: &none,
        lo: &none,
    };
    // SAFETY: same target features; the decoder only reads `bytes` within the row.
    unsafe { RowDecoder::new(layout, levels).unpack(&bytes[..layout.bytes()], 0, codes) }
}

/// # Safety
/// CPU must support AVX2+FMA+F16C; arguments as checked by `super::dequantize`.
#[target_feature(enable = "avx2,fma,f16c")]
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
