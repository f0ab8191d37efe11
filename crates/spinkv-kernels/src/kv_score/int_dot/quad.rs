//! NEON / SIMD128 integer key scan, one body for both 4-lane ISAs: codes cut into 16-bit lanes
//! and their int16 levels looked up by a byte shuffle of the group's 16-byte table of int8
//! levels (`codes::quad::CutPlan`: `tbl` on NEON, `i8x16.swizzle` on SIMD128), products summed
//! in int32 (the ISA file, `neon.rs` or `simd128.rs`: `vmlal_s16` or `i32x4.dot_i16x8_s`).
//!
//! A row's codes become int16 levels laid out as the padded query is. Rows go four at a time:
//! each query head's 8-channel slices are loaded once for the four, the four int32 sums come
//! out of one transposing reduction, and the float epilogue runs on the four lanes at once
//! (the same operations on each lane as the scalar reference: integer sums, then two
//! multiplies, so the same bits). Layouts the cut does not take go through the generic row
//! loop (`score_unpacked_rows`, a scalar table lookup per code).
//!
//! The generic row loop ran the key scan of `spinkv bench --kernels --isa simd128` (turbo int
//! K3.5, 8 pages a call) at ~150 ns a row in node on an AMD EPYC Zen 4; see
//! docs/PERFORMANCE.md for this kernel's.

use super::{
    epilogue, padded, query_len, score_unpacked_rows, IntQueries, IntRows, GROUP, MAX_INT_DIM,
};
use crate::codes::quad::{zero_levels8, CutPlan, Levels8, RowDecoder};
use crate::codes::Levels;

#[cfg(target_arch = "aarch64")]
#[path = "neon.rs"]
mod isa;
#[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
#[path = "simd128.rs"]
mod isa;

/// Vectors of 8 int16 levels a row takes at most (the largest padded query).
const MAX_VECTORS: usize = (MAX_INT_DIM + 2 * GROUP) / 8;
/// Rows scored together.
const ROWS: usize = 4;

/// # Safety
/// NEON or SIMD128 (whichever this build has); shapes as checked by
/// `super::score_codes_int`.
pub unsafe fn score_codes_int(
    r: IntRows<'_>,
    queries: IntQueries<'_>,
    scores: &mut [f32],
    stride: usize,
) {
    if try_score(r, queries, scores, stride) {
        return;
    }
    // The unpacker needs level tables only to decode, never to unpack.
    let none = [0.0f32; 16];
    let levels = Levels {
        hi: &none,
        lo: &none,
    };
    // SAFETY: same target features as this function; the decoder reads only the row's bytes.
    let decoder = unsafe { RowDecoder::new(r.layout, levels) };
    // SAFETY: same target features as this function; `row` is one whole packed row.
    let unpack = |row: &[u8], codes: &mut [u8]| unsafe { decoder.unpack(row, 0, codes) };
    score_unpacked_rows(r, queries, scores, stride, unpack);
}

/// The scan (see the module); `false` for layouts it does not take (groups that do not start
/// on a byte, rows shorter than 16 bytes), which the caller's generic loop scores.
fn try_score(r: IntRows<'_>, queries: IntQueries<'_>, scores: &mut [f32], stride: usize) -> bool {
    let layout = r.layout;
    let Some([hi, lo]) = layout.segments() else {
        return false;
    };
    let bytes = layout.bytes();
    let [pad_hi, _] = padded(layout);
    let (Some(hi_plan), Some(lo_plan)) = (
        CutPlan::new(hi.len, hi.width, hi.byte, bytes, &r.levels.hi, 0),
        CutPlan::new(lo.len, lo.width, lo.byte, bytes, &r.levels.lo, pad_hi),
    ) else {
        return false;
    };
    let len = query_len(layout);
    let n = r.scales.len();
    // Row by row through each page (`IntRows::row` divides by the page's rows per row).
    let mut rows = r
        .pages
        .iter()
        .enumerate()
        .flat_map(|(p, page)| {
            let in_page = n.saturating_sub(p * r.page_rows).min(r.page_rows);
            page[..in_page * bytes].chunks_exact(bytes)
        })
        .take(n);
    // Each block row's levels in the query's padded layout; vectors no group writes (padding)
    // stay zero, and meet zero query lanes anyway.
    let mut levels: [[Levels8; MAX_VECTORS]; ROWS] = [[zero_levels8(); MAX_VECTORS]; ROWS];
    let mut j0 = 0;
    while j0 < n {
        if j0 % 16 == 0 {
            crate::prefetch::pump_rows(16);
        }
        let nb = (n - j0).min(ROWS);
        for block_row in levels.iter_mut().take(nb) {
            let row = rows.next().expect("a row for every scale");
            for plan in [&hi_plan, &lo_plan].into_iter().filter(|p| p.groups > 0) {
                plan.place(row, block_row);
            }
        }
        for h in 0..queries.n_qh {
            let q = queries.head(h, len);
            let mut acc = [isa::zero_sums(); ROWS];
            for (k, eight) in q.chunks_exact(8).enumerate() {
                let qv = isa::load_query8(eight.try_into().expect("8 int16s"));
                for (acc, row_levels) in acc.iter_mut().zip(&levels) {
                    *acc = isa::dot_add(*acc, row_levels[k], qv);
                }
            }
            let sums = isa::transpose_sum(acc);
            let factor = queries.factor(h);
            let out = &mut scores[h * stride + j0..h * stride + j0 + nb];
            if nb == ROWS {
                let scales = r.scales[j0..j0 + ROWS].try_into().expect("4 scales");
                out.copy_from_slice(&isa::scores4(factor, sums, scales));
            } else {
                let lanes = isa::lanes(sums);
                for ((o, &sum), &scale) in out.iter_mut().zip(&lanes).zip(&r.scales[j0..]) {
                    *o = epilogue(factor, sum, scale);
                }
            }
        }
        j0 += nb;
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codes::CodeLayout;
    use crate::kv_score::int_dot::IntLevels;

    /// The presets' key layouts take the cut scan (the parity suite then checks its bits);
    /// rows under 16 bytes and groups off a byte keep the generic loop.
    #[test]
    fn the_cut_scan_takes_the_presets_key_layouts() {
        let levels: Vec<f32> = (0..16).map(|v| v as f32 - 7.5).collect();
        let takes = |layout: CodeLayout| {
            let levels = Levels {
                hi: &levels,
                lo: &levels,
            };
            let int_levels = IntLevels::new(&layout, levels).expect("supported");
            let no_pages: &[&[u8]] = &[];
            let rows = IntRows {
                pages: no_pages,
                page_rows: 1,
                layout: &layout,
                levels: &int_levels,
                scales: &[],
            };
            let queries = IntQueries {
                n_qh: 0,
                values: &[],
                value_stride: 0,
                factors: &[],
                factor_stride: 1,
            };
            try_score(rows, queries, &mut [], 0)
        };
        for d in [64usize, 128, 256] {
            for half_bits in [4u8, 6, 7, 8] {
                assert!(takes(CodeLayout::for_half_bits(d, half_bits)), "d={d} {half_bits}");
            }
        }
        // 15-byte rows, then 12-byte rows.
        assert!(!takes(CodeLayout::for_half_bits(33, 7)));
        assert!(!takes(CodeLayout::for_half_bits(64, 3)));
    }
}
