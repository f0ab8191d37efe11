//! NEON / SIMD128 accumulation, one body for both 4-lane ISAs: each value row with a non-zero
//! weight is decoded (codes) or widened (fp16) once into an aligned row buffer, then added to
//! every query head's sum; codes on the integer grid (`super::grid`) go through the grid scan
//! below instead, in int16 products summed exactly in int32.
//! SIMD128 sums fp16 rows 8 channels at a time with a tile of heads' sums in registers
//! (`simd128_f16.rs`, the same bits as the row loop).
//!
//! The grid scan: a 32-row chunk's live rows are cut to int16 grid levels
//! (`codes::quad::CutPlan`) into a block buffer, and each query head's grid weights are paired
//! row by row into one int32 (row `2p` in the low half, `2p + 1` in the high). The ISA file
//! (`neon.rs`, `simd128.rs`) adds a pair of rows' weighted levels to the sums of 8 channels:
//! on SIMD128 the two rows' levels interleaved channel by channel, so one `i32x4.dot_i16x8_s`
//! adds both rows to four channels (the interleave shared by a tile of heads); on NEON
//! `vmlal_lane_s16` by each row's weight. The chunk's integer sums are exact (below 2^24, as the
//! grid guarantees), so converted to f32 they are the reference's float sums, and
//! `grid::add_chunk` adds them as it does: the same bits as `scalar::accumulate_codes`.

use super::grid::{self, GridLevels, CHUNK};
use super::{accumulate_code_rows, accumulate_f16_rows, live_rows};
use crate::codes::quad::{zero_levels8, CutPlan, Levels8, RowDecoder};
use crate::codes::{CodeLayout, CodedRows, Levels};
use crate::vec_f32::quad::axpy;
use half::f16;

#[cfg(target_arch = "aarch64")]
#[path = "neon.rs"]
mod isa;
#[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
#[path = "simd128.rs"]
mod isa;
#[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
#[path = "simd128_f16.rs"]
mod f16_tiles;

/// # Safety
/// NEON or SIMD128 (whichever this build has); shapes as checked by `super::accumulate_f16`.
pub unsafe fn accumulate_f16(
    values: &[f16],
    d: usize,
    weights: &[f32],
    stride: usize,
    acc: &mut [f32],
) {
    #[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
    if f16_tiles::takes(d) {
        // SAFETY: SIMD128, this function's target; shapes as checked.
        return unsafe { f16_tiles::accumulate_f16(values, d, weights, stride, acc) };
    }
    // SAFETY: as this function's.
    unsafe { accumulate_f16_generic(values, d, weights, stride, acc) }
}

/// The generic row loop on fp16 values: each row with a non-zero weight widened into a buffer,
/// then added to every head's sum (NEON's path, and SIMD128's for head dims `f16_tiles` leaves).
///
/// # Safety
/// As [`accumulate_f16`].
#[inline(always)]
pub(crate) unsafe fn accumulate_f16_generic(
    values: &[f16],
    d: usize,
    weights: &[f32],
    stride: usize,
    acc: &mut [f32],
) {
    // SAFETY (both closures): same target features as this function; equal lengths.
    let convert = |x: &[f16], row: &mut [f32]| unsafe { crate::convert::quad::f16_to_f32(x, row) };
    let axpy = |w: f32, x: &[f32], y: &mut [f32]| unsafe { axpy(w, x, y) };
    accumulate_f16_rows(values, d, weights, stride, acc, convert, axpy);
}

/// # Safety
/// NEON or SIMD128 (whichever this build has); shapes as checked by `super::accumulate_codes`.
pub unsafe fn accumulate_codes(r: CodedRows<'_>, weights: &[f32], stride: usize, acc: &mut [f32]) {
    if let Some(setup) = Setup::new(r.layout, r.levels) {
        return setup.accumulate(r, weights, stride, acc);
    }
    // SAFETY (all unsafe here): same target features as this function; every row lies inside
    // `codes` (checked), the levels were checked against the layout.
    let grid = GridLevels::new(r.layout, r.levels);
    let levels = grid.as_ref().map_or(r.levels, GridLevels::levels);
    let decoder = unsafe { RowDecoder::new(r.layout, levels) };
    let decode = |at: usize, row: &mut [f32]| unsafe { decoder.decode(r.codes, at, levels, row) };
    let axpy = |w: f32, x: &[f32], y: &mut [f32]| unsafe { axpy(w, x, y) };
    let step = grid.as_ref().map(|g| g.step);
    accumulate_code_rows(r, step, weights, stride, acc, decode, axpy);
}

/// [`accumulate_codes`] over a run of pages of `page_rows` rows each (a multiple of the grid's
/// chunk, so chunks start at each page's first row as they do page by page), with the grid and
/// the cuts set up once for the run; `false` (nothing done) for a layout the grid scan does not
/// take.
///
/// # Safety
/// NEON or SIMD128 (whichever this build has); shapes as checked by
/// `super::accumulate_code_pages`.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn accumulate_pages(
    pages: &[&[u8]],
    page_rows: usize,
    layout: &CodeLayout,
    levels: Levels<'_>,
    scales: &[f32],
    weights: &[f32],
    stride: usize,
    acc: &mut [f32],
) -> bool {
    debug_assert!(page_rows.is_multiple_of(CHUNK));
    let Some(setup) = Setup::new(layout, levels) else {
        return false;
    };
    for (first, r) in super::page_rows_of(pages, page_rows, layout, levels, scales) {
        setup.accumulate(r, &weights[first..], stride, acc);
    }
    true
}

/// Largest head dim the grid scan takes (the chunk's sums live on the stack).
const MAX_DIM: usize = 256;
/// Query heads per tile (their 6 accumulators, a pair's two rows and weights stay in
/// registers).
const TILE_Q: usize = 3;

/// What a run of calls with one layout and codebook shares: the grid and the two groups' cuts.
struct Setup {
    grid: GridLevels,
    vectors: usize,
    hi_plan: CutPlan,
    lo_plan: CutPlan,
}

impl Setup {
    /// `None` for layouts the grid scan does not take (not on the grid, a segment that does not
    /// start on a byte or on a multiple of 8 channels, rows shorter than 16 bytes, head dims
    /// above 256), which the generic row loop scores.
    fn new(layout: &CodeLayout, levels: Levels<'_>) -> Option<Self> {
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
        let hi_plan = CutPlan::new(hi.len, hi.width, hi.byte, bytes, &table(on_grid.hi), 0)?;
        let lo_plan = CutPlan::new(lo.len, lo.width, lo.byte, bytes, &table(on_grid.lo), hi.len)?;
        Some(Setup {
            grid,
            vectors: d.div_ceil(8),
            hi_plan,
            lo_plan,
        })
    }

    /// The grid scan (see the module) of `r`'s rows, chunks from its first row on; `r` of the
    /// layout this was set up for, shapes as checked by `super::accumulate_codes`.
    fn accumulate(&self, r: CodedRows<'_>, weights: &[f32], stride: usize, acc: &mut [f32]) {
        let vectors = self.vectors;
        crate::scratch::with_reused(&BLOCK, |block| {
            if block.len() < CHUNK * vectors {
                block.resize(CHUNK * vectors, zero_levels8());
            }
            self.accumulate_chunks(r, &mut block[..CHUNK * vectors], weights, stride, acc);
        })
    }

    fn accumulate_chunks(
        &self,
        r: CodedRows<'_>,
        block: &mut [Levels8],
        weights: &[f32],
        stride: usize,
        acc: &mut [f32],
    ) {
        let vectors = self.vectors;
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
                    for plan in [&self.hi_plan, &self.lo_plan]
                        .into_iter()
                        .filter(|p| p.groups > 0)
                    {
                        plan.place(row, row_levels);
                    }
                }
            }
            let n_pairs = nc.div_ceil(2);
            for h0 in (0..n_qh).step_by(TILE_Q) {
                let tile = (n_qh - h0).min(TILE_Q);
                for (i, (pair, factor)) in
                    pairs.iter_mut().zip(&mut factors).take(tile).enumerate()
                {
                    let w = &weights[(h0 + i) * stride + c0..][..nc];
                    ws.fill(0.0);
                    for ((q, w), s) in ws.iter_mut().zip(w).zip(&r.scales[c0..c0 + nc]) {
                        *q = w * s;
                    }
                    // Rows past `nc` are 0 and leave the largest as it is.
                    let largest = isa::largest_magnitude(&ws);
                    *factor = grid::quantize_chunk_by(&mut ws, largest, self.grid.step);
                    // Grid weights are integers of at most 127 in magnitude: exact as int16.
                    for (p, pair) in pair.iter_mut().enumerate() {
                        let (a, b) = (ws[2 * p] as i16, ws[2 * p + 1] as i16);
                        *pair = (a as u16 as i32) | ((b as i32) << 16);
                    }
                }
                for k in 0..vectors {
                    let mut sum = [[isa::zero_sums(); 2]; TILE_Q];
                    for p in 0..n_pairs {
                        // A row past `nc` (odd `nc`) is left from an earlier chunk: finite, and
                        // its weight is 0.
                        let rows = isa::pair(block[2 * p * vectors + k], block[(2 * p + 1) * vectors + k]);
                        for (sum, pair) in sum.iter_mut().zip(&pairs).take(tile) {
                            isa::add_pair(sum, rows, pair[p]);
                        }
                    }
                    for (sum, sums) in sum.iter().zip(&mut sums).take(tile) {
                        let eight: &mut [f32; 8] =
                            (&mut sums[8 * k..8 * k + 8]).try_into().expect("8 floats");
                        *eight = isa::to_f32(*sum);
                    }
                }
                for (i, (sums, &factor)) in sums.iter().zip(&factors).take(tile).enumerate() {
                    grid::add_chunk(&sums[..d], factor, &mut acc[(h0 + i) * d..][..d]);
                }
            }
        }
    }
}

thread_local! {
    /// A chunk's rows of int16 levels, `[CHUNK][vectors]`, reused across calls: a row left
    /// from an earlier chunk or call is finite and meets zero weights. Zeroing a 16 KiB stack
    /// block per call cost about as much as the scan of a page (SIMD128, in node).
    static BLOCK: std::cell::RefCell<Vec<Levels8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// SIMD128's fp16 value tiles against the generic row loop, bit for bit: head dims the tiles
/// take (and some they leave), 1 to 9 heads, negative weights with and without zero ones, sums
/// starting at signed zeros, inf/NaN and other special halves.
#[cfg(all(
    target_arch = "wasm32",
    target_feature = "simd128",
    any(test, feature = "parity")
))]
pub(crate) fn f16_tiles_parity() -> crate::test_util::Check {
    use crate::test_util::*;
    let mut rng = Rng::new(61);
    let stride = 37;
    for d in [4usize, 8, 16, 40, 64, 72, 128, 256] {
        let shapes = [(1usize, 1usize), (3, 32), (3, 33), (4, 5), (4, 4), (5, 37), (9, 33)];
        for (n_qh, rows) in shapes.into_iter().chain([(9, 32), (2, 8)]) {
            let values = crate::kv_score::special_f16_rows(&mut rng, rows, d);
            // Zero weights in odd rounds only (the tiles test weights only where one is 0).
            let zeros = rows % 2 == 1;
            let weights: Vec<f32> = (0..n_qh * stride)
                .map(|_| match rng.below(5) {
                    0 if zeros => 0.0,
                    1 => -rng.uniform().abs(),
                    _ => rng.uniform().abs(),
                })
                .collect();
            let mut want: Vec<f32> = random_vec(rng.next_u64(), n_qh * d);
            for (i, v) in want.iter_mut().enumerate() {
                if i % 7 == 0 {
                    *v = if i % 2 == 0 { -0.0 } else { 0.0 };
                }
            }
            let mut got = want.clone();
            // SAFETY: SIMD128 (this build); shapes as `super::accumulate_f16` checks them.
            unsafe {
                accumulate_f16_generic(&values, d, &weights, stride, &mut want);
                accumulate_f16(&values, d, &weights, stride, &mut got);
            }
            identical_bits(&got, &want, &|| {
                format!("accumulate_f16 tiles vs rows d={d} n_qh={n_qh} rows={rows}")
            })?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The presets' value layouts take the grid scan (the parity suite then checks its bits);
    /// a second group off a multiple of 8 channels, short rows, wide codes and head dims above
    /// 256 keep the generic loop.
    #[test]
    fn the_grid_scan_takes_the_presets_value_layouts() {
        let table: Vec<f32> = (0..32).map(|v| v as f32 - 7.5).collect();
        let takes = |layout: CodeLayout| {
            let levels = Levels {
                hi: &table,
                lo: &table,
            };
            Setup::new(&layout, levels).is_some()
        };
        for d in [64usize, 128, 256] {
            for half_bits in [4u8, 5, 6, 7, 8] {
                assert!(takes(CodeLayout::for_half_bits(d, half_bits)), "d={d} {half_bits}");
            }
        }
        // Channels 20.. start the 3-bit group; 7-byte rows; 5-bit codes; d 320.
        assert!(!takes(CodeLayout::for_half_bits(40, 7)));
        assert!(!takes(CodeLayout::for_half_bits(17, 6)));
        assert!(!takes(CodeLayout::for_half_bits(64, 10)));
        assert!(!takes(CodeLayout::for_half_bits(320, 6)));
    }
}
