//! WASM SIMD128 value scan on the integer grid (`super::grid`), in int16 products summed
//! exactly in int32 by `i32x4.dot_i16x8_s`.
//!
//! A 32-row chunk's live rows are cut to int16 grid levels (`codes::quad::CutPlan`) into a block
//! buffer, and each query head's grid weights are paired row by row into one int32 (row `2p`
//! in the low half, `2p + 1` in the high). Interleaving two rows' levels channel by channel
//! then lets one dot product add both rows' contributions to four channels: per 8 channels
//! and pair of rows, two shuffles shared by a tile of heads and two dot products a head. The
//! chunk's integer sums are exact (below 2^24, as the grid guarantees), so converted to f32
//! they are the reference's float sums, and `grid::add_chunk` adds them as it does: the same
//! bits as `scalar::accumulate_codes`.

use core::arch::wasm32::*;

use super::super::live_rows;
use super::super::grid::{self, GridLevels, CHUNK};
use crate::codes::quad::CutPlan as Plan;
use crate::codes::{CodeLayout, CodedRows, Levels};
use crate::round::round_even;

/// Largest head dim taken (the block buffer lives on the stack).
const MAX_DIM: usize = 256;
/// Query heads per tile (their 6 accumulators, a pair's two shuffled vectors and weights stay
/// in registers).
const TILE_Q: usize = 3;

/// What a run of calls with one layout and codebook shares: the grid and the two groups' cuts.
pub(super) struct Setup {
    grid: GridLevels,
    vectors: usize,
    hi_plan: Plan,
    lo_plan: Plan,
}

impl Setup {
    /// `None` for layouts this scan does not take (not on the grid, a segment that does not
    /// start on a byte or on a multiple of 8 channels, rows shorter than 16 bytes, head dims
    /// above 256), which the generic row loop scores.
    pub(super) fn new(layout: &CodeLayout, levels: Levels<'_>) -> Option<Self> {
        let d = layout.d;
        let [hi, lo] = layout.segments()?;
        if d == 0 || d > MAX_DIM {
            return None;
        }
        let grid = GridLevels::new(layout, levels)?;
        let bytes = layout.bytes();
        let on_grid = grid.levels();
        // Grid levels are integers of at most 127 in magnitude: exact as int8.
        let table = |t: &[f32]| -> [i8; 16] { core::array::from_fn(|i| t[i] as i8) };
        let hi_plan = Plan::new(hi.len, hi.width, hi.byte, bytes, &table(on_grid.hi), 0)?;
        let lo_plan = Plan::new(lo.len, lo.width, lo.byte, bytes, &table(on_grid.lo), hi.len)?;
        Some(Setup {
            grid,
            vectors: d.div_ceil(8),
            hi_plan,
            lo_plan,
        })
    }

    /// The scan (see the module) of `r`'s rows, chunks from its first row on.
    ///
    /// # Safety
    /// SIMD128 (this build has it); `r` of the layout this was set up for; shapes as checked by
    /// `super::accumulate_codes`.
    pub(super) unsafe fn accumulate(
        &self,
        r: CodedRows<'_>,
        weights: &[f32],
        stride: usize,
        acc: &mut [f32],
    ) {
        let vectors = self.vectors;
        crate::scratch::with_reused(&BLOCK, |block| {
            if block.len() < CHUNK * vectors {
                block.resize(CHUNK * vectors, u16x8_splat(0));
            }
            // SAFETY: this build has SIMD128 (caller).
            unsafe { accumulate_chunks(self, r, &mut block[..CHUNK * vectors], weights, stride, acc) };
        })
    }
}

thread_local! {
    /// A chunk's rows of int16 levels, `[CHUNK][vectors]`, reused across calls: a row left
    /// from an earlier chunk or call is finite and meets zero weights. Zeroing a 16 KiB stack
    /// block per call cost about as much as the scan of a page.
    static BLOCK: std::cell::RefCell<Vec<v128>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// [`grid::quantize_chunk`] with the largest magnitude found four lanes at a time: `f32::max`
/// compiles to a call of libm's `fmaxf` on wasm32 (its NaN rule is not `f32x4.max`'s), which
/// took ~5 % of a browser decode at depth 4,096. For finite weights the same largest value,
/// so the same grid.
#[inline(always)]
fn quantize_chunk(ws: &mut [f32; CHUNK], level_step: f32) -> f32 {
    let mut m = f32x4_splat(0.0);
    for four in ws.chunks_exact(4) {
        // SAFETY: `four` holds 4 floats.
        let v = unsafe { v128_load(four.as_ptr() as *const v128) };
        m = f32x4_max(m, f32x4_abs(v));
    }
    let m = f32x4_max(m, i32x4_shuffle::<2, 3, 0, 1>(m, m));
    let m = f32x4_max(m, i32x4_shuffle::<1, 0, 3, 2>(m, m));
    let largest = f32x4_extract_lane::<0>(m);
    match grid::weight_scale(largest) {
        Some(to_grid) => {
            for w in ws.iter_mut() {
                *w = round_even(*w * to_grid);
            }
            grid::chunk_factor(largest, level_step)
        }
        None => {
            ws.fill(0.0);
            0.0
        }
    }
}

/// # Safety
/// SIMD128.
unsafe fn accumulate_chunks(
    setup: &Setup,
    r: CodedRows<'_>,
    block: &mut [v128],
    weights: &[f32],
    stride: usize,
    acc: &mut [f32],
) {
    let (grid, vectors) = (&setup.grid, setup.vectors);
    let d = r.layout.d;
    let bytes = r.layout.bytes();
    let n_qh = acc.len() / d;
    let rows = r.scales.len();
    let mut ws = [0.0f32; CHUNK];
    // Per head of the tile and pair of rows, the two rows' grid weights as one int32.
    let mut pairs = [[0i32; CHUNK / 2]; TILE_Q];
    let mut factors = [0.0f32; TILE_Q];
    let mut sums = [[0.0f32; MAX_DIM + 8]; TILE_Q];
    for c0 in (0..rows).step_by(CHUNK) {
        let nc = (rows - c0).min(CHUNK);
        crate::prefetch::pump_rows(nc);
        let live = live_rows(weights, stride, n_qh, c0, nc);
        if live == 0 {
            continue;
        }
        for (t, row_levels) in block.chunks_exact_mut(vectors).enumerate().take(nc) {
            if live & 1 << t != 0 {
                let row = &r.codes[(c0 + t) * bytes..(c0 + t + 1) * bytes];
                for plan in [&setup.hi_plan, &setup.lo_plan].into_iter().filter(|p| p.groups > 0) {
                    plan.place(row, row_levels);
                }
            }
        }
        let n_pairs = nc.div_ceil(2);
        for h0 in (0..n_qh).step_by(TILE_Q) {
            let tile = (n_qh - h0).min(TILE_Q);
            for (i, (pair, factor)) in pairs.iter_mut().zip(&mut factors).take(tile).enumerate() {
                let w = &weights[(h0 + i) * stride + c0..][..nc];
                ws.fill(0.0);
                for ((q, w), s) in ws.iter_mut().zip(w).zip(&r.scales[c0..c0 + nc]) {
                    *q = w * s;
                }
                // Rows past `nc` are 0 and leave the largest as it is.
                *factor = quantize_chunk(&mut ws, grid.step);
                // Grid weights are integers of at most 127 in magnitude: exact as int16.
                for (p, pair) in pair.iter_mut().enumerate() {
                    let (a, b) = (ws[2 * p] as i16, ws[2 * p + 1] as i16);
                    *pair = (a as u16 as i32) | ((b as i32) << 16);
                }
            }
            for k in 0..vectors {
                let mut sum = [[i32x4_splat(0); 2]; TILE_Q];
                for p in 0..n_pairs {
                    let (a, b) = (block[2 * p * vectors + k], block[(2 * p + 1) * vectors + k]);
                    let low = i16x8_shuffle::<0, 8, 1, 9, 2, 10, 3, 11>(a, b);
                    let high = i16x8_shuffle::<4, 12, 5, 13, 6, 14, 7, 15>(a, b);
                    for (sum, pair) in sum.iter_mut().zip(&pairs).take(tile) {
                        let w = i32x4_splat(pair[p]);
                        sum[0] = i32x4_add(sum[0], i32x4_dot_i16x8(low, w));
                        sum[1] = i32x4_add(sum[1], i32x4_dot_i16x8(high, w));
                    }
                }
                for (sum, sums) in sum.iter().zip(&mut sums).take(tile) {
                    // SAFETY: 8k + 8 <= MAX_DIM + 8 floats.
                    unsafe {
                        let at = sums.as_mut_ptr().add(8 * k);
                        v128_store(at as *mut v128, f32x4_convert_i32x4(sum[0]));
                        v128_store(at.add(4) as *mut v128, f32x4_convert_i32x4(sum[1]));
                    }
                }
            }
            for (i, (sums, &factor)) in sums.iter().zip(&factors).take(tile).enumerate() {
                grid::add_chunk(&sums[..d], factor, &mut acc[(h0 + i) * d..][..d]);
            }
        }
    }
}
