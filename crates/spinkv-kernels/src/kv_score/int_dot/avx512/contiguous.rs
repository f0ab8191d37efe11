//! The AVX-512 scan of four consecutive rows per register pair, for rows of 64 padded codes
//! whose two 32-code halves are each of one channel group: head dim 64 at 3.5, 4 or 3 bits
//! (the turbo presets' keys on a 64-dim model), in pages of a multiple of 16 rows.
//!
//! A page stores its rows back to back, so a quad of four rows (at most 128 bytes) is two
//! loads, with no per-row insert. One `vpermt2b` per half gathers, for every row and each run
//! of 16 codes, the 8 bytes those codes sit in into one 64-bit lane (a row's two runs in its
//! 128-bit quarter); two `vpmultishiftqb` then cut the lane's codes 0–7 and 8–15 into bytes of
//! their own, and one unmasked `vpermb` each looks them up in the half's group table. So a
//! quad costs 2 loads, 2 gathers, 4 cuts, 4 lookups and, per query head, 4 `vpdpbusd` — where
//! the paired scan spends 4 loads, 2 inserts, 4 gathers, 4 cuts and 4 masked lookups. The
//! lanes' query coordinates follow the codes' order (dealt once per call), the padding meets
//! zero coordinates whatever level it looks up, and the integer sums are the scalar
//! reference's, so the bits are too. The tables, cut controls and dealt queries stay in
//! registers for the whole run.
//!
//! A half of 4-bit codes that start on a byte (K3.5's first group, K4) is cut without
//! `vpmultishiftqb`: its gather puts a row's 16 bytes in the row's quarter, the low nibbles
//! are the even codes as they stand (the lookup reads 6 bits of an index and the table repeats
//! every 16 entries) and a 16-bit shift right by 4 brings the odd ones down; the query is dealt
//! even and odd coordinates to match. In-process A/B of `attend_bench turbo 7680` (one thread,
//! AMD EPYC Zen 4), with the cuts for both halves against this: 1.012, 1.015, 1.007.

use super::paired::{code_bit, mask_of, reduce_quads, table, BIAS};
use crate::codes::CodeLayout;
use crate::kv_score::int_dot::{padded, query_len, IntQueries, IntRows};
use std::arch::x86_64::*;
use std::cell::RefCell;

/// Rows per quad (one per 128-bit quarter).
const QUAD: usize = 4;
/// Rows per block: four quads, one vector of 16 scores per head.
const BLOCK: usize = 16;
/// Padded codes of a row: two halves of 32.
const CODES: usize = 64;
/// Codes of a 64-bit lane after its gather; a cut takes 8 of them.
const RUN: usize = 16;
/// Query heads per pass over the rows (their sums and dealt queries stay in registers).
const HEADS: usize = 4;

/// The layout's controls: per half, the gather and the two cuts' shifts.
struct Plan {
    layout: CodeLayout,
    gather: [__m512i; 2],
    shift: [[__m512i; 2]; 2],
    /// The channel group of each half.
    group: [usize; 2],
    /// Halves of 4-bit codes from a byte on: their gather puts a row's 16 bytes in its
    /// quarter, and the cuts are the bytes themselves (low nibbles: even codes) and the bytes
    /// shifted right by 4 (odd codes), with no `vpmultishiftqb` (`shift` unused).
    nibbles: [bool; 2],
    /// Per half and cut: where each lane's query coordinate is in the head's 64, as `vpermb`
    /// indices (the lanes' order, [`pass`]).
    deal: [[__m512i; 2]; 2],
}

thread_local! {
    /// The last layout asked about, and its plan if it has one.
    static PLAN: RefCell<Option<(CodeLayout, Option<Plan>)>> = const { RefCell::new(None) };
}

impl Plan {
    /// `None` unless `layout` is one this scan takes (see the module doc).
    fn new(layout: &CodeLayout) -> Option<Self> {
        let bytes = layout.bytes();
        if bytes == 0 || QUAD * bytes > 128 || query_len(layout) != CODES {
            return None;
        }
        let [pad_hi, _] = padded(layout);
        let width = |g: usize| (if g == 0 { layout.hi } else { layout.lo }) as usize;
        let (mut gather, mut shift) = ([[0u8; 64]; 2], [[[0u8; 64]; 2]; 2]);
        let (mut group, mut nibbles) = ([0usize; 2], [false; 2]);
        for half in 0..2 {
            let codes: Vec<Option<(usize, usize)>> = (0..CODES / 2)
                .map(|i| code_bit(layout, pad_hi, half * CODES / 2 + i))
                .collect();
            let mut groups = codes.iter().flatten().map(|&(_, g)| g);
            let g = groups.next().unwrap_or(0);
            if groups.any(|other| other != g) {
                return None;
            }
            group[half] = g;
            for (run, codes) in codes.chunks(RUN).enumerate() {
                let start = codes.iter().flatten().next().map_or(0, |&(bit, _)| bit / 8);
                // Every code of the run inside the 8 bytes gathered from its first one's byte.
                if codes
                    .iter()
                    .flatten()
                    .any(|&(bit, g)| bit + width(g) > 8 * (start + 8))
                {
                    return None;
                }
                for row in 0..QUAD {
                    let lane = 8 * (2 * row + run);
                    for i in 0..8 {
                        gather[half][lane + i] = (row * bytes + start + i).min(127) as u8;
                    }
                    for (cut, shift) in shift[half].iter_mut().enumerate() {
                        for i in 0..8 {
                            if let Some((bit, _)) = codes[8 * cut + i] {
                                shift[lane + i] = (bit - 8 * start) as u8;
                            }
                        }
                    }
                }
            }
            // A half of 4-bit codes, code i at bit first + 4i from a byte on, is cut by nibble:
            // its gather takes the row's 16 bytes into the row's quarter instead.
            if let Some(&Some((first, g))) = codes.first() {
                let consecutive = codes
                    .iter()
                    .enumerate()
                    .all(|(i, code)| code.is_none_or(|(bit, _)| bit == first + 4 * i));
                if width(g) == 4 && first % 8 == 0 && consecutive {
                    nibbles[half] = true;
                    for row in 0..QUAD {
                        for i in 0..16 {
                            gather[half][16 * row + i] =
                                (row * bytes + first / 8 + i).min(127) as u8;
                        }
                    }
                }
            }
        }
        // Quarter byte i of a cut holds code 32·half + 16·(i / 8) + 8·cut + i % 8 after a
        // multishift, code 32·half + 2i + cut after a nibble cut; every quarter alike.
        let deal = |half: usize, cut: usize| -> [u8; 64] {
            core::array::from_fn(|b| {
                let i = b % 16;
                let at = if nibbles[half] {
                    2 * i + cut
                } else {
                    RUN * (i / 8) + 8 * cut + i % 8
                };
                (CODES / 2 * half + at) as u8
            })
        };
        let load = |b: &[u8; 64]| {
            // SAFETY: a 64-byte array; AVX-512 F is present (the caller's dispatch).
            unsafe { _mm512_loadu_si512(b.as_ptr() as *const __m512i) }
        };
        Some(Plan {
            layout: *layout,
            gather: gather.each_ref().map(load),
            shift: shift.each_ref().map(|s| s.each_ref().map(load)),
            group,
            nibbles,
            deal: core::array::from_fn(|half| core::array::from_fn(|cut| load(&deal(half, cut)))),
        })
    }
}

/// Scores the rows if this scan takes their layout and pages; `false` (nothing written)
/// otherwise.
///
/// # Safety
/// CPU must support AVX-512 F/BW/VL/VBMI/VNNI (+AVX2/FMA/F16C); shapes as checked by
/// `super::super::score_codes_int`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx512vnni,avx2,fma,f16c")]
pub(super) unsafe fn try_score(
    r: IntRows<'_>,
    queries: IntQueries<'_>,
    scores: &mut [f32],
    stride: usize,
) -> bool {
    if !r.page_rows.is_multiple_of(BLOCK) {
        return false;
    }
    PLAN.with(|cell| {
        let mut cell = cell.borrow_mut();
        if cell.as_ref().is_none_or(|(layout, _)| layout != r.layout) {
            *cell = Some((*r.layout, Plan::new(r.layout)));
        }
        let Some((_, Some(plan))) = cell.as_ref() else {
            return false;
        };
        debug_assert_eq!(plan.layout, *r.layout);
        let tables = [
            table(&r.levels.hi, r.layout.hi),
            table(&r.levels.lo, r.layout.lo),
        ];
        let tables = [tables[plan.group[0]], tables[plan.group[1]]];
        let mut h0 = 0;
        while h0 < queries.n_qh {
            let heads = (queries.n_qh - h0).min(HEADS);
            // SAFETY: as the caller vouches; heads h0..h0 + heads exist.
            unsafe {
                let nib = plan.nibbles;
                macro_rules! go {
                    ($h:expr) => {
                        match nib {
                            [true, true] => {
                                pass::<$h, true, true>(plan, tables, r, queries, h0, scores, stride)
                            }
                            [true, false] => pass::<$h, true, false>(
                                plan, tables, r, queries, h0, scores, stride,
                            ),
                            [false, true] => pass::<$h, false, true>(
                                plan, tables, r, queries, h0, scores, stride,
                            ),
                            [false, false] => pass::<$h, false, false>(
                                plan, tables, r, queries, h0, scores, stride,
                            ),
                        }
                    };
                }
                match heads {
                    1 => go!(1),
                    2 => go!(2),
                    3 => go!(3),
                    _ => go!(HEADS),
                }
            }
            h0 += heads;
        }
        true
    })
}

/// Scores every row for query heads `h0..h0 + H` (`tables`: each half's).
///
/// # Safety
/// As [`try_score`], whose checks passed.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx512vnni,avx2,fma,f16c")]
unsafe fn pass<const H: usize, const N0: bool, const N1: bool>(
    plan: &Plan,
    tables: [__m512i; 2],
    r: IntRows<'_>,
    queries: IntQueries<'_>,
    h0: usize,
    scores: &mut [f32],
    stride: usize,
) {
    // `plan.nibbles` as constants, so each half's cut is fixed when this compiles.
    let nibble = [N0, N1];
    let mut dealt = [[[_mm512_setzero_si512(); H]; 2]; 2];
    let mut bias = [0i32; H];
    for h in 0..H {
        let q = queries.head(h0 + h, CODES);
        // SAFETY: the head's 64 int16s, two registers of 32.
        let (low, high) = unsafe {
            (
                _mm512_loadu_si512(q.as_ptr() as *const __m512i),
                _mm512_loadu_si512(q.as_ptr().add(32) as *const __m512i),
            )
        };
        // The padding is zeros, so this is the sum over the lanes.
        let ones = _mm512_set1_epi16(1);
        let sum = _mm512_add_epi32(_mm512_madd_epi16(low, ones), _mm512_madd_epi16(high, ones));
        bias[h] = BIAS * _mm512_reduce_add_epi32(sum);
        // The int16s hold int8 values (`QUERY_MAX`), so truncating them is exact.
        let coords = _mm512_inserti64x4::<1>(
            _mm512_castsi256_si512(_mm512_cvtepi16_epi8(low)),
            _mm512_cvtepi16_epi8(high),
        );
        for (dealt, deal) in dealt.iter_mut().zip(&plan.deal) {
            for (dealt, deal) in dealt.iter_mut().zip(deal) {
                dealt[h] = _mm512_permutexvar_epi8(*deal, coords);
            }
        }
    }
    let factors: [__m512; H] = core::array::from_fn(|h| _mm512_set1_ps(queries.factor(h0 + h)));
    // Quad `m` holds rows 4m..4m + 4, one per quarter, so the reduction leaves row 4m + k in
    // lane 4k + m: this puts it back in row order.
    let order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    let bytes = r.layout.bytes();
    let rows = r.scales.len();
    // A block's sums are scaled and stored after the next block's quads: the reduction's
    // permute, the conversion and the two multiplies are one latency chain per head, and run
    // back to back with their own block's quads they held the quads of the next one up
    // (`kernel_bench`'s key scan 2.13–2.15 ns a row against 2.28–2.30, AMD EPYC Zen 4). Holding
    // the quads' accumulators unreduced instead spilled registers (2.28–2.31).
    let mut pending: Option<([__m512i; H], usize, usize)> = None;
    let mut finish = |sums: [__m512i; H], j0: usize, nb: usize| {
        let mask = ((1u32 << nb) - 1) as __mmask16;
        // SAFETY: rows j0..j0 + nb have scales; masked lanes stay inside.
        let scale = unsafe { _mm512_maskz_loadu_ps(mask, r.scales.as_ptr().add(j0)) };
        for h in 0..H {
            let sum = _mm512_permutexvar_epi32(order, sums[h]);
            // Wrapping int32 sums: exact once the bias is off, whatever the order.
            let sum = _mm512_sub_epi32(sum, _mm512_set1_epi32(bias[h]));
            // The reference's `(factor · sum) · scale`, unfused.
            let out = _mm512_mul_ps(_mm512_mul_ps(factors[h], _mm512_cvtepi32_ps(sum)), scale);
            let at = (h0 + h) * stride + j0;
            // SAFETY: the nb scores from `at` lie inside `scores` (stride ≥ rows, checked).
            unsafe { _mm512_mask_storeu_ps(scores.as_mut_ptr().add(at), mask, out) };
        }
    };
    for (p, page) in r.pages.iter().enumerate().take(rows.div_ceil(r.page_rows)) {
        let first = p * r.page_rows;
        let in_page = (rows - first).min(r.page_rows);
        for b0 in (0..in_page).step_by(BLOCK) {
            let nb = (in_page - b0).min(BLOCK);
            let j0 = first + b0;
            // SAFETY: the block's rows lie inside the page (checked by the caller).
            let base = unsafe { page.as_ptr().add(b0 * bytes) };
            // One quad's sums per head from its `present` bytes at `at`.
            let quad = |at: *const i8, present: usize| -> [__m512i; H] {
                // SAFETY: the masked loads stay inside the quad's present rows.
                let (a, b) = unsafe {
                    (
                        _mm512_maskz_loadu_epi8(mask_of(present), at),
                        _mm512_maskz_loadu_epi8(
                            mask_of(present.saturating_sub(64)),
                            at.wrapping_add(64),
                        ),
                    )
                };
                let mut acc = [_mm512_setzero_si512(); H];
                for half in 0..2 {
                    let gathered = _mm512_permutex2var_epi8(a, plan.gather[half], b);
                    for (cut, (shift, dealt)) in
                        plan.shift[half].iter().zip(&dealt[half]).enumerate()
                    {
                        let code = if !nibble[half] {
                            _mm512_multishift_epi64_epi8(*shift, gathered)
                        } else if cut == 0 {
                            gathered
                        } else {
                            _mm512_srli_epi16::<4>(gathered)
                        };
                        let levels = _mm512_permutexvar_epi8(code, tables[half]);
                        for (acc, dealt) in acc.iter_mut().zip(dealt) {
                            *acc = _mm512_dpbusd_epi32(*acc, levels, *dealt);
                        }
                    }
                }
                acc
            };
            // A whole block's four quads in a loop of constant length, unrolled with their
            // masks fixed: `kernel_bench`'s key scan 2.31–2.33 ns a row against 2.50–2.54 with
            // the loop below for every block, decode attention at depth 7,680 B/A 0.933, 0.965
            // in-process (turbo, 2 threads, AMD EPYC Zen 4).
            let quads: [[__m512i; H]; QUAD] = if nb == BLOCK {
                core::array::from_fn(|m| {
                    quad(
                        base.wrapping_add(m * QUAD * bytes) as *const i8,
                        QUAD * bytes,
                    )
                })
            } else {
                let mut quads = [[_mm512_setzero_si512(); H]; QUAD];
                for (sums, quad_rows) in quads.iter_mut().zip((0..nb).step_by(QUAD)) {
                    // The quad's bytes that are rows of the block: never past the page's rows.
                    let present = (nb - quad_rows).min(QUAD) * bytes;
                    *sums = quad(base.wrapping_add(quad_rows * bytes) as *const i8, present);
                }
                quads
            };
            let sums: [__m512i; H] = core::array::from_fn(|h| reduce_quads(&quads.map(|q| q[h])));
            if let Some((sums, j0, nb)) = pending.take() {
                finish(sums, j0, nb);
            }
            pending = Some((sums, j0, nb));
            crate::prefetch::pump_rows_avx512(nb);
        }
    }
    if let Some((sums, j0, nb)) = pending.take() {
        finish(sums, j0, nb);
    }
}
