//! The integer grid narrow value codes are accumulated on.
//!
//! Codes of at most 4 bits have at most 16 levels, so a value scan spends its time turning
//! codes into levels and multiplying them by weights, not on the levels' precision. On the
//! grid, levels are integers `|ℓ| ≤ 127` (one step for both tables: the largest level over
//! 127) and each 32-row chunk's weights `w · scale` are integers `|q| ≤ 127` (a step per query
//! head: the chunk's largest over 127, rounded to nearest even). A chunk's sum `Σ q · ℓ` is then
//! an exact integer below 2^24 — exact in f32 arithmetic in any order, with or without FMA, and
//! in 8-bit dot products (AVX-512 VNNI, four rows per instruction) — and is added to the
//! accumulator once as `acc + sum · (weight step · level step)`.
//!
//! So every ISA returns the same bits by construction. The grid's own error is small against
//! the codes': a level moves by at most half a step (1/254 of the largest), against a 3-bit
//! Lloyd–Max cell ~1/4 of it wide; a weight by 1/254 of its chunk's largest, noise ~4 % of the
//! size of the value codes' own error on that chunk (added in quadrature: ~0.1 %).
//!
//! Chunks start at each page's first row (a call over one block is one page), so a result does
//! not depend on how pages are grouped into calls.

use crate::codes::{CodeLayout, Levels};
use crate::round::round_even;

/// Rows per chunk (one weight step each).
pub(crate) const CHUNK: usize = 32;
/// Largest weight on the grid.
pub(crate) const WEIGHT_STEPS: f32 = 127.0;
/// Largest level on the grid.
pub(crate) const LEVEL_STEPS: f32 = 127.0;
/// Widest code accumulated on the grid.
const MAX_WIDTH: u32 = 4;

// A chunk's largest possible sum stays exact in f32.
const _: () = assert!(CHUNK as f32 * WEIGHT_STEPS * LEVEL_STEPS < (1 << 24) as f32);

/// Whether values of this layout accumulate on the grid (every channel at most 4 bits).
pub(crate) fn applies(layout: &CodeLayout) -> bool {
    (layout.n_hi == 0 || layout.hi <= MAX_WIDTH)
        && (layout.n_hi == layout.d || layout.lo <= MAX_WIDTH)
}

/// Both level tables on the grid, and the step that maps them back.
pub(crate) struct GridLevels {
    hi: [f32; 16],
    lo: [f32; 16],
    /// Level = grid level · `step`.
    pub(crate) step: f32,
}

impl GridLevels {
    /// `None` unless [`applies`] holds for the layout.
    pub(crate) fn new(layout: &CodeLayout, levels: Levels<'_>) -> Option<Self> {
        if !applies(layout) {
            return None;
        }
        let used = |table: &[f32], width: u32, present: bool| -> ([f32; 16], usize) {
            let mut out = [0.0; 16];
            let n = if present { 1 << width } else { 0 };
            out[..n].copy_from_slice(&table[..n]);
            (out, n)
        };
        let (mut hi, n_hi) = used(levels.hi, layout.hi, layout.n_hi > 0);
        let (mut lo, n_lo) = used(levels.lo, layout.lo, layout.n_hi < layout.d);
        let largest = hi[..n_hi]
            .iter()
            .chain(&lo[..n_lo])
            .fold(0.0f32, |m, v| m.max(v.abs()));
        let to_grid = LEVEL_STEPS / largest;
        if !(largest > 0.0 && to_grid.is_finite()) {
            // Every level is (almost) zero: so is every sum.
            return Some(GridLevels {
                hi: [0.0; 16],
                lo: [0.0; 16],
                step: 0.0,
            });
        }
        for v in hi[..n_hi].iter_mut().chain(lo[..n_lo].iter_mut()) {
            *v = round_even(*v * to_grid);
        }
        Some(GridLevels {
            hi,
            lo,
            step: largest / LEVEL_STEPS,
        })
    }

    /// The grid levels, as tables the decoders read.
    pub(crate) fn levels(&self) -> Levels<'_> {
        Levels {
            hi: &self.hi,
            lo: &self.lo,
        }
    }
}

/// The factor that puts a chunk's weights on the grid, from their largest magnitude; `None`
/// when the chunk carries no weight.
#[inline]
pub(crate) fn weight_scale(largest: f32) -> Option<f32> {
    let to_grid = WEIGHT_STEPS / largest;
    (largest > 0.0 && to_grid.is_finite()).then_some(to_grid)
}

/// What a chunk's integer sums are multiplied by when they are added to the accumulator.
#[inline]
pub(crate) fn chunk_factor(largest: f32, level_step: f32) -> f32 {
    largest / WEIGHT_STEPS * level_step
}

/// Puts one chunk's weights (`w · scale` of one query head) on the grid in place and returns
/// its [`chunk_factor`], 0 (every weight 0) when it carries none. SIMD stages compute the same
/// values: the largest magnitude, one division, a multiply and a round-to-nearest-even each.
pub(crate) fn quantize_chunk(ws: &mut [f32], level_step: f32) -> f32 {
    let largest = ws.iter().fold(0.0f32, |m, w| m.max(w.abs()));
    quantize_chunk_by(ws, largest, level_step)
}

/// [`quantize_chunk`] given the chunk's largest magnitude (found by the caller, as SIMD finds
/// it: the same value).
#[inline(always)]
pub(crate) fn quantize_chunk_by(ws: &mut [f32], largest: f32, level_step: f32) -> f32 {
    match weight_scale(largest) {
        Some(to_grid) => {
            for w in ws.iter_mut() {
                *w = round_even(*w * to_grid);
            }
            chunk_factor(largest, level_step)
        }
        None => {
            ws.fill(0.0);
            0.0
        }
    }
}

/// [`quantize_chunk`] of the 32 weights in `ws` (lanes past the chunk's rows hold 0) with `V`'s
/// registers: the same values bit for bit.
///
/// # Safety
/// `V`'s target features.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(crate) unsafe fn quantize_chunk_x86<V: crate::simd::x86::Vector>(
    ws: &mut [f32; CHUNK],
    level_step: f32,
) -> f32 {
    // SAFETY: the caller's features; every access is inside the 32 floats.
    unsafe {
        let mut m = V::zero();
        for h in (0..CHUNK).step_by(V::N) {
            m = V::max_abs(m, V::load(ws.as_ptr().add(h)));
        }
        let largest = V::reduce_max(m);
        match weight_scale(largest) {
            Some(to_grid) => {
                let k = V::splat(to_grid);
                for h in (0..CHUNK).step_by(V::N) {
                    let at = ws.as_mut_ptr().add(h);
                    V::store(at, V::round_even(V::mul(V::load(at), k)));
                }
                chunk_factor(largest, level_step)
            }
            None => {
                ws.fill(0.0);
                0.0
            }
        }
    }
}

/// `acc[c] += sums[c] · factor`, a multiply then an add (never fused), as every ISA does it.
#[inline]
pub(crate) fn add_chunk(sums: &[f32], factor: f32, acc: &mut [f32]) {
    for (a, s) in acc.iter_mut().zip(sums) {
        *a += s * factor;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_land_on_the_grid() {
        let layout = CodeLayout::for_half_bits(64, 7); // 4-bit then 3-bit channels
        let hi: Vec<f32> = (0..16).map(|i| (i as f32 - 7.5) * 0.37).collect();
        let lo: Vec<f32> = (0..8).map(|i| (i as f32 - 3.5) * 0.61).collect();
        let grid = GridLevels::new(&layout, Levels { hi: &hi, lo: &lo }).unwrap();
        let largest = 7.5 * 0.37f32;
        assert_eq!(grid.hi[15], LEVEL_STEPS);
        assert_eq!(grid.hi[0], -LEVEL_STEPS);
        for (q, v) in grid.hi.iter().zip(&hi).chain(grid.lo.iter().zip(&lo)) {
            assert_eq!(*q, q.round());
            assert!(
                (q * grid.step - v).abs() <= 0.5 * largest / LEVEL_STEPS * 1.0001,
                "{q} {v}"
            );
        }
        assert!(
            GridLevels::new(&CodeLayout::uniform(64, 5), Levels { hi: &hi, lo: &hi }).is_none()
        );
    }

    /// The reference's grid result lies within the grid's own error bound of the exact sum:
    /// per element, half a level step times `Σ |w·scale|` plus, per chunk, half a weight step
    /// times `Σ |level|` over its rows (the bound the module docs describe).
    #[test]
    fn grid_sums_stay_within_half_a_step_of_exact() {
        use crate::codes::CodedRows;
        use crate::test_util::Rng;
        let mut rng = Rng::new(77);
        for (d, half_bits, rows) in [(64usize, 6u8, 100usize), (64, 7, 64), (128, 4, 37)] {
            let layout = CodeLayout::for_half_bits(d, half_bits);
            let (packed, hi, lo) = crate::kv_score::random_block(&mut rng, &layout, rows);
            let levels = Levels { hi: &hi, lo: &lo };
            let scales: Vec<f32> = (0..rows).map(|_| 0.5 + rng.uniform().abs()).collect();
            let weights: Vec<f32> = (0..rows).map(|_| rng.uniform().abs().powi(3)).collect();
            let block = CodedRows::new(&packed, &layout, levels, &scales);
            let mut got = vec![0.0f32; d];
            super::super::scalar::accumulate_codes(block, &weights, rows, &mut got);
            let mut row = vec![0.0f32; d];
            let largest = hi.iter().chain(&lo).fold(0.0f32, |m, v| m.max(v.abs()));
            let level_half_step = 0.5 * largest / LEVEL_STEPS;
            for (c, &g) in got.iter().enumerate() {
                let (mut exact, mut bound) = (0.0f64, 1e-5f64);
                for c0 in (0..rows).step_by(CHUNK) {
                    let chunk = c0..rows.min(c0 + CHUNK);
                    let ws: Vec<f32> = chunk.clone().map(|j| weights[j] * scales[j]).collect();
                    let m = ws.iter().fold(0.0f32, |m, w| m.max(w.abs()));
                    for (j, w) in chunk.zip(&ws) {
                        crate::codes::scalar::dequantize(
                            &packed[j * layout.bytes()..][..layout.bytes()],
                            &layout,
                            levels,
                            &mut row,
                        );
                        exact += *w as f64 * row[c] as f64;
                        bound += (w.abs() * level_half_step) as f64;
                        bound += (0.5 * m / WEIGHT_STEPS * row[c].abs()) as f64;
                    }
                }
                let err = (g as f64 - exact).abs();
                assert!(
                    err <= bound,
                    "d={d} {half_bits}/2 bits c={c}: {g} vs {exact}"
                );
            }
        }
    }

    #[test]
    fn chunk_weights_round_to_the_nearest_step() {
        let mut ws = vec![0.5f32, 0.25, 0.0, -0.125, 1e-6, 0.4999];
        let orig = ws.clone();
        let factor = quantize_chunk(&mut ws, 1.0);
        assert_eq!(ws[0], WEIGHT_STEPS);
        assert_eq!(ws[2], 0.0);
        for (q, w) in ws.iter().zip(&orig) {
            assert!((q * factor - w).abs() <= 0.5 * factor * 1.0001);
        }
        let mut none = vec![0.0f32; 4];
        assert_eq!(quantize_chunk(&mut none, 1.0), 0.0);
        let mut tiny = vec![f32::from_bits(1); 4];
        assert_eq!(quantize_chunk(&mut tiny, 1.0), 0.0);
        assert!(tiny.iter().all(|&q| q == 0.0));
    }
}
