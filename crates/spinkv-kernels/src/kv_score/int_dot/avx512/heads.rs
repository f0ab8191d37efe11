//! The AVX-512 integer scan for many query heads at once (prefill): the run's levels laid out
//! once, then one `vpdpbusd` per 16 scores.
//!
//! The paired scan cuts and looks up every row's codes once per four heads, and sums each
//! row's products across a register, so every 16 rows and head end in a transposing reduction.
//! A prefill item scores every key row against hundreds of query heads (64 queries × the
//! group), so here the run is decoded once: each row's biased levels (`level + 128`, unsigned
//! bytes) in the query's padded layout, stored so that one 64-byte load holds 4 consecutive
//! coordinates of 16 rows (`tile[block][quad][row][4]`). `vpdpbusd` of that load with a head's
//! 4 int8 query coordinates broadcast to every lane adds 4 products to each row's int32 sum:
//! after `query_len / 4` of them a register holds the 16 rows' sums in order, with no reduction.
//! Eight heads share each load. The bias comes off as `128 · Σ q` per head; the sums are exact
//! integers, so the scores are the scalar reference's bits.

use super::super::{place_levels, query_len, IntQueries, IntRows, MAX_INT_DIM};
use crate::codes::CodeLayout;
use crate::simd::avx512::tail_mask;
use std::arch::x86_64::*;
use std::cell::RefCell;

/// Rows per block: one register of int32 sums.
const BLOCK: usize = 16;
/// Heads whose sums stay in registers while a block's quads stream past.
const HEADS: usize = 8;
/// Added to an int8 level to make it an unsigned byte.
const BIAS: u8 = 128;
/// Largest padded query length (`query_len` at [`MAX_INT_DIM`]).
const MAX_LEN: usize = MAX_INT_DIM + 32;

/// Query heads from which [`score`] runs instead of the paired scan. In-process A/B of prefill
/// (SmolLM2-135M F16, turbo, 2 threads, AMD EPYC Zen 4; B/A of tok/s, B this scan): 40 tokens
/// after 1,024 (items of 30 heads) 1.032 and 1.022; 128 after 1,024, 1.002 and 1.027; 256
/// after 512, 1.003; 256 after 3,840, 1.108. Decode (3 heads) keeps the paired scan.
pub(super) const MIN_HEADS: usize = 16;

/// Per-thread buffers: the run's level tile and the heads' int8 queries.
#[derive(Default)]
struct Scratch {
    tile: Vec<u8>,
    queries: Vec<i8>,
    /// `128 · Σ q` per head.
    bias: Vec<i32>,
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
}

/// # Safety
/// CPU must support AVX-512 F/BW/VL and VNNI (+AVX2/FMA/F16C); shapes as checked by
/// `score_codes_int`.
pub(super) unsafe fn score(r: IntRows<'_>, queries: IntQueries<'_>, scores: &mut [f32], stride: usize) {
    if r.scales.is_empty() || queries.n_qh == 0 {
        return;
    }
    SCRATCH.with(|cell| {
        let mut scratch = cell.borrow_mut();
        // SAFETY: as the caller vouches.
        unsafe { score_with(&mut scratch, r, queries, scores, stride) }
    })
}

/// # Safety
/// As [`score`].
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn score_with(
    scratch: &mut Scratch,
    r: IntRows<'_>,
    queries: IntQueries<'_>,
    scores: &mut [f32],
    stride: usize,
) {
    let layout = r.layout;
    let len = query_len(layout);
    let quads = len / 4;
    let n = r.scales.len();
    let blocks = n.div_ceil(BLOCK);
    let n_qh = queries.n_qh;

    scratch.queries.clear();
    scratch.bias.clear();
    for h in 0..n_qh {
        let q = queries.head(h, len);
        // Quantised queries are within ±63 (`QUERY_MAX`): int8 without loss.
        scratch.queries.extend(q.iter().map(|&v| v as i8));
        let sum: i32 = q.iter().map(|&v| v as i32).sum();
        scratch.bias.push(sum * BIAS as i32);
    }

    scratch.tile.resize(blocks * BLOCK * len, 0);
    lay_out(r, &mut scratch.tile);

    let tile = scratch.tile.as_ptr();
    let q8 = scratch.queries.as_ptr();
    for block in 0..blocks {
        let rows = (n - block * BLOCK).min(BLOCK);
        let mask = tail_mask(rows);
        // SAFETY: the block's rows are below n, so its scales exist (masked load).
        let row_scales = unsafe { _mm512_maskz_loadu_ps(mask, r.scales.as_ptr().add(block * BLOCK)) };
        // The block's quads: `quads` registers of 64 bytes, one after another.
        // SAFETY: the tile holds `blocks · BLOCK · len` bytes.
        let levels = unsafe { tile.add(block * BLOCK * len) };
        let mut h0 = 0;
        while h0 < n_qh {
            let heads = (n_qh - h0).min(HEADS);
            // A last group of fewer heads repeats its last one (every register stays in use
            // and the loop keeps one shape); only real heads are stored.
            let query: [*const i8; HEADS] =
                // SAFETY: head min(h0 + i, n_qh - 1) exists and holds `len` bytes.
                core::array::from_fn(|i| unsafe { q8.add((h0 + i).min(n_qh - 1) * len) });
            let mut acc = [_mm512_setzero_si512(); HEADS];
            for quad in 0..quads {
                // SAFETY: quad < len / 4, inside the block's BLOCK · len bytes and each
                // head's query.
                unsafe {
                    let block_quad = _mm512_loadu_si512(levels.add(quad * 64) as *const _);
                    for (acc, query) in acc.iter_mut().zip(query) {
                        let q = (query.add(quad * 4) as *const i32).read_unaligned();
                        *acc = _mm512_dpbusd_epi32(*acc, block_quad, _mm512_set1_epi32(q));
                    }
                }
            }
            for (i, acc) in acc.iter().enumerate().take(heads) {
                let h = h0 + i;
                let sum = _mm512_sub_epi32(*acc, _mm512_set1_epi32(scratch.bias[h]));
                // The scalar epilogue's two roundings: `(factor · sum) · scale`.
                let scaled = _mm512_mul_ps(
                    _mm512_set1_ps(queries.factor(h)),
                    _mm512_cvtepi32_ps(sum),
                );
                let out = _mm512_mul_ps(scaled, row_scales);
                // SAFETY: rows below n ≤ stride of head h's scores (checked by the caller).
                unsafe {
                    _mm512_mask_storeu_ps(
                        scores.as_mut_ptr().add(h * stride + block * BLOCK),
                        mask,
                        out,
                    )
                };
            }
            h0 += heads;
        }
    }
}

/// Every row of the run as biased levels in the query's padded layout, 4 coordinates of one
/// row to a 32-bit word, the words of 16 rows side by side: word `quad` of row `j` at
/// `tile[((j / 16) · quads + quad) · 64 + (j % 16) · 4]`. Padding (and the rows of a last
/// partial block) hold level 0.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
fn lay_out(r: IntRows<'_>, tile: &mut [u8]) {
    let layout: &CodeLayout = r.layout;
    let (d, n_hi) = (layout.d, layout.n_hi);
    let len = query_len(layout);
    let quads = len / 4;
    let biased = |table: &[i8; 16]| table.map(|v| (v as i16 + BIAS as i16) as u8);
    let (hi, lo) = (biased(&r.levels.hi), biased(&r.levels.lo));
    let none = [0.0f32; 16];
    let bare = crate::codes::Levels {
        hi: &none,
        lo: &none,
    };
    // Only `unpack` is used, which reads no levels.
    let decoder = crate::codes::avx512::RowDecoder::new(layout, bare);
    let mut codes = [0u8; MAX_INT_DIM];
    let codes = &mut codes[..d];
    // Rows of at most 64 codes whose padded layout is the channels' own (both groups whole
    // multiples of 16, as at head dim 64): looked up 64 codes at a time by byte shuffles.
    let vector = len == d && d <= 64;
    let in_row: __mmask64 = if d >= 64 { !0 } else { (1u64 << d) - 1 };
    let in_hi: __mmask64 = if n_hi >= 64 { !0 } else { (1u64 << n_hi) - 1 };
    let in_lanes = |table: [u8; 16]| {
        // SAFETY: a 16-byte read of a 16-byte array.
        let lane = unsafe { _mm_loadu_si128(table.as_ptr() as *const __m128i) };
        _mm512_broadcast_i32x4(lane)
    };
    let (hi_table, lo_table) = (in_lanes(hi), in_lanes(lo));
    let mut row = [BIAS; MAX_LEN];
    let row = &mut row[..len];
    let n = r.scales.len();
    for j in 0..n.div_ceil(BLOCK) * BLOCK {
        if j % BLOCK == 0 {
            crate::prefetch::pump_rows_avx512(BLOCK);
        }
        if j < n && vector {
            // SAFETY: AVX-512 F/BW/VL (this function's features); the row holds
            // layout.bytes(); `codes` and `row` hold d = len ≤ 64 bytes (masked accesses).
            unsafe {
                decoder.unpack(r.row(j), 0, codes);
                let bytes = _mm512_maskz_loadu_epi8(in_row, codes.as_ptr() as *const i8);
                let levels = _mm512_mask_blend_epi8(
                    in_hi,
                    _mm512_shuffle_epi8(lo_table, bytes),
                    _mm512_shuffle_epi8(hi_table, bytes),
                );
                _mm512_mask_storeu_epi8(row.as_mut_ptr() as *mut i8, in_row, levels);
            }
        } else if j < n {
            // SAFETY: this function runs with AVX-512 F/BW/VL; the row holds layout.bytes().
            unsafe { decoder.unpack(r.row(j), 0, codes) };
            place_levels(layout, codes, &hi, &lo, row);
        } else {
            row.fill(BIAS);
        }
        let (block, lane) = (j / BLOCK, j % BLOCK);
        let words = tile[block * quads * 64..(block + 1) * quads * 64].as_mut_ptr();
        for (quad, word) in row.chunks_exact(4).enumerate() {
            // SAFETY: quad < quads and lane < 16: inside the block's quads · 64 bytes.
            unsafe {
                let at = words.add(quad * 64 + lane * 4) as *mut [u8; 4];
                at.write_unaligned([word[0], word[1], word[2], word[3]]);
            }
        }
    }
}
