//! AVX2 integer scan, two ways.
//!
//! The wide way (every preset's layout: both channel groups whole runs of 32 codes, rows of
//! at least 16 bytes) cuts a run of 32 codes out of one 16-byte broadcast load — 4-bit codes
//! by nibble (a per-half shift and a mask), narrower ones by a byte shuffle that gives each
//! code's two bytes a 16-bit lane, one 64-bit variable shift per register (the lanes of a
//! qword hold codes that sit at the same bit offset) and a mask, packed back to bytes — and
//! looks all 32 up with one `vpshufb`. The levels come out biased to unsigned bytes
//! (`level + 128`), which `vpmaddubsw` multiplies by the query's bytes as they are: the query
//! is 7-bit (`QUERY_MAX`), so a pair of products stays inside int16 (2 · 255 · 63 < 2^15), and
//! one `vpmaddwd` by ones takes the pairs to int32 — two multiplies and an add a head and run,
//! with no unpacks to int16. The bias comes back off as `128 · Σ q` per head; the sum is exact
//! in wrapping int32, so the result is the reference's bits. The codes come out in an order of
//! their own: the query is permuted to match once per call. Decoded rows stay in registers;
//! each query head's sums go to an 8-row block whose horizontal sums are reduced together.
//!
//! The bytewise way (any other supported layout) cuts codes 16 at a time: the group's `2w`
//! bytes are broadcast, a byte shuffle puts each code's two bytes into its own 16-bit lane, a
//! multiply by a per-lane power of two lifts the code to the top of the lane and a shift
//! brings it down (AVX2 has no per-lane 16-bit shift); a second byte shuffle looks the int8
//! levels up, sign-extended in place. Rows are decoded in blocks of 8 into a small buffer,
//! then every query head's int16 × int16 → int32 products are summed per row.

use super::{padded, IntQueries, IntRows, GROUP};
use std::arch::x86_64::*;
use std::mem::MaybeUninit;

mod wide;
use wide::WidePlan;

/// Rows per block.
const BLOCK: usize = 8;
/// Int16 lanes of a decoded row at most (`query_len` of the largest head dim).
const MAX_ROW: usize = super::MAX_INT_DIM + 2 * GROUP;

/// One channel group's constants.
#[derive(Clone, Copy)]
struct GroupPlan {
    /// Byte of the row where the group's codes start.
    byte: usize,
    /// Bytes per 16 codes (`2w`).
    step: usize,
    /// Groups of 16 codes (the last may be partial).
    groups: usize,
    /// Where the group's levels start in the decoded row.
    first: usize,
    ctrl: __m256i,
    mult: __m256i,
    shift: __m128i,
    table: __m256i,
}

/// Byte shuffle and multipliers for 16 codes of `width` bits in 16-bit lanes (lanes 0..8 in
/// the low 128 bits, 8..16 in the high; the 8-byte word sits in both halves).
const fn lane_constants(width: usize) -> ([u8; 32], [u16; 16]) {
    let (mut ctrl, mut mult) = ([0u8; 32], [0u16; 16]);
    let mut k = 0;
    while k < GROUP {
        let bit = width * k;
        let (byte, s) = (bit / 8, bit % 8);
        let at = 2 * (k % 8) + 16 * (k / 8);
        ctrl[at] = byte as u8;
        // A code never reaches past the 8-byte word; when it ends in this byte, the next one
        // (possibly the word's repeat at 8) is shifted out above the lane.
        ctrl[at + 1] = (byte + 1) as u8;
        mult[k] = 1 << (16 - width - s);
        k += 1;
    }
    (ctrl, mult)
}

/// [`lane_constants`] of every width 1..=4 (index = width; 0 unused), at compile time.
static LANES: [([u8; 32], [u16; 16]); 5] = {
    let mut t = [([0u8; 32], [0u16; 16]); 5];
    let mut w = 1;
    while w <= 4 {
        t[w] = lane_constants(w);
        w += 1;
    }
    t
};

impl GroupPlan {
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn new(byte: usize, width: u32, len: usize, first: usize, table: &[i8; 16]) -> Self {
        let (ctrl, mult) = &LANES[width as usize];
        // SAFETY: 32-byte and 16-byte local arrays.
        unsafe {
            GroupPlan {
                byte,
                step: 2 * width as usize,
                groups: len.div_ceil(GROUP),
                first,
                ctrl: _mm256_loadu_si256(ctrl.as_ptr() as *const __m256i),
                mult: _mm256_loadu_si256(mult.as_ptr() as *const __m256i),
                shift: _mm_cvtsi32_si128(16 - width as i32),
                table: _mm256_broadcastsi128_si256(_mm_loadu_si128(
                    table.as_ptr() as *const __m128i
                )),
            }
        }
    }

    /// Int16 levels of 16 codes packed at the bottom of `word`.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn levels(&self, word: u64) -> __m256i {
        let x = _mm256_shuffle_epi8(_mm256_set1_epi64x(word as i64), self.ctrl);
        let code = _mm256_srl_epi16(_mm256_mullo_epi16(x, self.mult), self.shift);
        // High bytes look up entry 0; the shifts sign-extend the low byte over them.
        let level = _mm256_shuffle_epi8(self.table, code);
        _mm256_srai_epi16::<8>(_mm256_slli_epi16::<8>(level))
    }
}

/// The 8 bytes at `at` of `bytes` as a little-endian word, zeros past the slice's end.
#[inline(always)]
fn word_at(bytes: &[u8], at: usize) -> u64 {
    if at + 8 <= bytes.len() {
        // SAFETY: 8 bytes from `at` lie inside the slice.
        unsafe { core::ptr::read_unaligned(bytes.as_ptr().add(at) as *const u64) }
    } else {
        let mut word = [0u8; 8];
        let n = bytes.len().saturating_sub(at).min(8);
        word[..n].copy_from_slice(&bytes[at..at + n]);
        u64::from_le_bytes(word)
    }
}

/// Sums of the 8 int32 lanes of each of `acc[0..8]`, lane `t` of the result for `acc[t]`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn reduce8(acc: &[__m256i; BLOCK]) -> __m256i {
    let h01 = _mm256_hadd_epi32(acc[0], acc[1]);
    let h23 = _mm256_hadd_epi32(acc[2], acc[3]);
    let h45 = _mm256_hadd_epi32(acc[4], acc[5]);
    let h67 = _mm256_hadd_epi32(acc[6], acc[7]);
    // Per 128-bit half: rows 0..4, then rows 4..8.
    let a = _mm256_hadd_epi32(h01, h23);
    let b = _mm256_hadd_epi32(h45, h67);
    let lo = _mm256_permute2x128_si256::<0x20>(a, b);
    let hi = _mm256_permute2x128_si256::<0x31>(a, b);
    _mm256_add_epi32(lo, hi)
}

/// # Safety
/// CPU must support AVX2+FMA+F16C; shapes as checked by `super::score_codes_int`.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn score_codes_int(
    r: IntRows<'_>,
    queries: IntQueries<'_>,
    scores: &mut [f32],
    stride: usize,
) {
    match WidePlan::new(r.layout, r.levels) {
        // SAFETY: same target features; shapes checked by the caller.
        Some(plan) => unsafe { wide::score(&plan, r, queries, scores, stride) },
        // SAFETY: as above.
        None => unsafe { score_codes_int_bytewise(r, queries, scores, stride) },
    }
}

/// The bytewise scan (see the module doc).
///
/// # Safety
/// CPU must support AVX2+FMA+F16C; shapes as checked by `super::score_codes_int`.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn score_codes_int_bytewise(
    r: IntRows<'_>,
    queries: IntQueries<'_>,
    scores: &mut [f32],
    stride: usize,
) {
    let layout = r.layout;
    let bytes = layout.bytes();
    let [pad_hi, pad_lo] = padded(layout);
    let len = pad_hi + pad_lo;
    let chunks = len / GROUP;
    let plans = [
        GroupPlan::new(0, layout.hi, layout.n_hi, 0, &r.levels.hi),
        GroupPlan::new(
            layout.n_hi * layout.hi as usize / 8,
            layout.lo,
            layout.d - layout.n_hi,
            pad_hi,
            &r.levels.lo,
        ),
    ];
    let rows = r.scales.len();
    let mut buf = MaybeUninit::<[i16; BLOCK * MAX_ROW]>::uninit();
    let buf = buf.as_mut_ptr() as *mut i16;
    // The next row to decode: its page and its byte offset there (rows are decoded in order,
    // so a run of pages costs one page switch per page, no division per row).
    let (mut page, mut in_page) = (0usize, 0usize);
    for j0 in (0..rows).step_by(BLOCK) {
        let nb = (rows - j0).min(BLOCK);
        for t in 0..BLOCK {
            // SAFETY: buffer row t has room for MAX_ROW >= len int16s; groups write inside it.
            unsafe {
                let dst = buf.add(t * len);
                if t >= nb {
                    // Rows past the block's end score nothing and are never stored.
                    core::ptr::write_bytes(dst, 0, len);
                    continue;
                }
                let codes = r.pages[page];
                let row = in_page * bytes;
                in_page += 1;
                if in_page == r.page_rows {
                    (page, in_page) = (page + 1, 0);
                }
                for plan in &plans {
                    for g in 0..plan.groups {
                        let word = word_at(codes, row + plan.byte + g * plan.step);
                        let out = dst.add(plan.first + g * GROUP) as *mut __m256i;
                        _mm256_storeu_si256(out, plan.levels(word));
                    }
                }
            }
        }
        let mut row_scales = [0.0f32; BLOCK];
        row_scales[..nb].copy_from_slice(&r.scales[j0..j0 + nb]);
        // SAFETY: 8-float local array.
        let scale = unsafe { _mm256_loadu_ps(row_scales.as_ptr()) };
        for h in 0..queries.n_qh {
            let q = queries.head(h, len);
            let mut acc = [_mm256_setzero_si256(); BLOCK];
            for c in 0..chunks {
                // SAFETY: chunk c lies inside the query (len int16s) and every buffer row.
                unsafe {
                    let qv = _mm256_loadu_si256(q.as_ptr().add(c * GROUP) as *const __m256i);
                    for (t, a) in acc.iter_mut().enumerate() {
                        let lv = _mm256_loadu_si256(buf.add(t * len + c * GROUP) as *const __m256i);
                        *a = _mm256_add_epi32(*a, _mm256_madd_epi16(lv, qv));
                    }
                }
            }
            let sums = _mm256_cvtepi32_ps(reduce8(&acc));
            let factor = _mm256_set1_ps(queries.factor(h));
            // The reference's `(factor · sum) · scale`, unfused.
            let out = _mm256_mul_ps(_mm256_mul_ps(factor, sums), scale);
            let mut eight = [0.0f32; BLOCK];
            // SAFETY: 8-float local array.
            unsafe { _mm256_storeu_ps(eight.as_mut_ptr(), out) };
            scores[h * stride + j0..h * stride + j0 + nb].copy_from_slice(&eight[..nb]);
        }
    }
}
