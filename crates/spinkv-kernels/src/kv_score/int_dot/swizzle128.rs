//! WASM SIMD128 integer scan: codes cut into 16-bit lanes, levels looked up by `i8x16.swizzle`
//! from the group's 16-byte table of int8 levels, products summed by `i32x4.dot_i16x8_s`.
//!
//! A row's codes become int16 levels laid out as the padded query is (`codes::swizzle128`).
//! Rows go four at a time: each query head's 8-channel slices are loaded once for the four,
//! the four int32 sums come out of one transposing reduction, and the float epilogue runs on the four lanes at once (the same operations on
//! each lane as the scalar reference: integer sums, then two multiplies, so the same bits).
//!
//! The generic 4-lane row loop (`score_unpacked_rows`, a scalar table lookup per code) ran
//! the key scan of `spinkv bench --kernels --isa simd128` (turbo int K3.5, 8 pages a call) at
//! ~150 ns a row in node on an AMD EPYC Zen 4; see docs/PERFORMANCE.md for this kernel's.

use core::arch::wasm32::*;

use super::super::{epilogue, padded, query_len, IntQueries, IntRows, GROUP, MAX_INT_DIM};
use crate::codes::swizzle128::Plan;

/// Vectors of 8 int16 levels a row takes at most (the largest padded query).
const MAX_VECTORS: usize = (MAX_INT_DIM + 2 * GROUP) / 8;
/// Rows scored together.
const ROWS: usize = 4;

/// Lane `r` of the result: the sum of the four int32 lanes of `v[r]` (wrapping, as the
/// scalar reference's sum).
#[inline(always)]
fn transpose_sum(v: [v128; ROWS]) -> v128 {
    // [a0+a2, b0+b2, a1+a3, b1+b3] and the same of c, d.
    let ab = i32x4_add(
        i32x4_shuffle::<0, 4, 1, 5>(v[0], v[1]),
        i32x4_shuffle::<2, 6, 3, 7>(v[0], v[1]),
    );
    let cd = i32x4_add(
        i32x4_shuffle::<0, 4, 1, 5>(v[2], v[3]),
        i32x4_shuffle::<2, 6, 3, 7>(v[2], v[3]),
    );
    i32x4_add(
        i32x4_shuffle::<0, 1, 4, 5>(ab, cd),
        i32x4_shuffle::<2, 3, 6, 7>(ab, cd),
    )
}

/// The scan (see the module); `false` for layouts it does not take (groups that do not start
/// on a byte, rows shorter than 16 bytes), which the caller's generic loop scores.
///
/// # Safety
/// SIMD128 (this build has it); shapes as checked by `super::score_codes_int`.
pub(super) unsafe fn try_score(
    r: IntRows<'_>,
    queries: IntQueries<'_>,
    scores: &mut [f32],
    stride: usize,
) -> bool {
    let layout = r.layout;
    let Some([hi, lo]) = layout.segments() else {
        return false;
    };
    let bytes = layout.bytes();
    let [pad_hi, _] = padded(layout);
    let (Some(hi_plan), Some(lo_plan)) = (
        Plan::new(hi.len, hi.width, hi.byte, bytes, &r.levels.hi, 0),
        Plan::new(lo.len, lo.width, lo.byte, bytes, &r.levels.lo, pad_hi),
    ) else {
        return false;
    };
    let len = query_len(layout);
    let vectors = len / 8;
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
    let mut levels = [[u16x8_splat(0); MAX_VECTORS]; ROWS];
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
            let mut acc = [i32x4_splat(0); ROWS];
            for k in 0..vectors {
                // SAFETY: k < len / 8: the 8 int16s at 8k lie inside the head's query.
                let qv = unsafe { v128_load(q.as_ptr().add(8 * k) as *const v128) };
                for (acc, row_levels) in acc.iter_mut().zip(&levels) {
                    *acc = i32x4_add(*acc, i32x4_dot_i16x8(row_levels[k], qv));
                }
            }
            let sums = transpose_sum(acc);
            let factor = queries.factor(h);
            let out = &mut scores[h * stride + j0..h * stride + j0 + nb];
            if nb == ROWS {
                let scales = &r.scales[j0..j0 + ROWS];
                // SAFETY: `scales` holds 4 floats and `out` 4 floats.
                unsafe {
                    let s = v128_load(scales.as_ptr() as *const v128);
                    let x = f32x4_mul(f32x4_mul(f32x4_splat(factor), f32x4_convert_i32x4(sums)), s);
                    v128_store(out.as_mut_ptr() as *mut v128, x);
                }
            } else {
                let mut lanes = [0i32; ROWS];
                // SAFETY: stores 16 bytes into a local array of 4 int32s.
                unsafe { v128_store(lanes.as_mut_ptr() as *mut v128, sums) };
                for ((o, &sum), &scale) in out.iter_mut().zip(&lanes).zip(&r.scales[j0..]) {
                    *o = epilogue(factor, sum, scale);
                }
            }
        }
        j0 += nb;
    }
    true
}
