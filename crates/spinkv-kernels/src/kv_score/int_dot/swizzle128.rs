//! WASM SIMD128 integer scan: codes cut into 16-bit lanes, levels looked up by `i8x16.swizzle`
//! from the group's 16-byte table of int8 levels, products summed by `i32x4.dot_i16x8_s`.
//!
//! Each group of 8 codes is cut from a 16-byte load of its row that holds the group's bytes:
//! a swizzle (its control planned once per call for that group's offset in the load) gives
//! each code its one or two bytes in a 16-bit lane, a multiply and a shift stand in for the
//! per-lane shift SIMD128 lacks, a mask keeps the code. Two groups' codes are narrowed into
//! 16 byte indices, looked up in one swizzle and widened back to two vectors of int16 levels,
//! laid out as the padded query is. Rows go four at a time: each query head's 8-channel
//! slices are loaded once for the four, the four int32 sums come out of one transposing
//! reduction, and the float epilogue runs on the four lanes at once (the same operations on
//! each lane as the scalar reference: integer sums, then two multiplies, so the same bits).
//!
//! The generic 4-lane row loop (`score_unpacked_rows`, a scalar table lookup per code) ran
//! the key scan of `spinkv bench --kernels --isa simd128` (turbo int K3.5, 8 pages a call) at
//! ~150 ns a row in node on an AMD EPYC Zen 4; see docs/PERFORMANCE.md for this kernel's.

use core::arch::wasm32::*;

use super::super::{epilogue, padded, query_len, IntQueries, IntRows, GROUP, MAX_INT_DIM};
use crate::codes::windows::WINDOWS_16;

/// Vectors of 8 int16 levels a row takes at most (the largest padded query).
const MAX_VECTORS: usize = (MAX_INT_DIM + 2 * GROUP) / 8;
/// Groups of 8 codes a channel group holds at most.
const MAX_GROUPS: usize = MAX_INT_DIM / 8;
/// Rows scored together.
const ROWS: usize = 4;

/// One channel group's constants: where its codes sit, its level table, where its levels go.
struct Plan {
    /// Groups of 8 codes (the last may be partial: its extra lanes meet zero query lanes).
    groups: usize,
    /// Per group of 8 codes: the row offset of its 16-byte load and the swizzle control that
    /// cuts the group's bytes out of that load.
    loads: [(usize, v128); MAX_GROUPS],
    mul: v128,
    mask: v128,
    /// The group's int8 levels, 16 bytes (entries past `2^width` unused).
    table: v128,
    /// The group's first vector in the query's padded layout.
    first_vector: usize,
}

impl Plan {
    /// `None` when a row is shorter than one 16-byte load.
    fn new(
        len: usize,
        width: u32,
        byte: usize,
        row_bytes: usize,
        table: &[i8; 16],
        first_channel: usize,
    ) -> Option<Self> {
        if row_bytes < 16 {
            return None;
        }
        let (ctrl, shift) = &WINDOWS_16[width as usize];
        let mul: [u16; 8] = core::array::from_fn(|k| 1u16 << (8 - shift[k]));
        let table: [u8; 16] = table.map(|v| v as u8);
        let groups = len.div_ceil(8);
        let mut loads = [(0usize, u8x16_splat(0)); MAX_GROUPS];
        for (g, load) in loads.iter_mut().enumerate().take(groups) {
            let at = byte + g * width as usize;
            let start = at.min(row_bytes - 16);
            // Zero-filling entries (0x80) stay at or above 16 and still select 0.
            let shifted: [u8; 16] = core::array::from_fn(|i| ctrl[i] + (at - start) as u8);
            // SAFETY: reads the 16 bytes of a local array.
            *load = (start, unsafe { v128_load(shifted.as_ptr() as *const v128) });
        }
        // SAFETY: each load reads 16 bytes of a local array.
        unsafe {
            Some(Plan {
                groups,
                loads,
                mul: v128_load(mul.as_ptr() as *const v128),
                mask: u16x8_splat((1u16 << width) - 1),
                table: v128_load(table.as_ptr() as *const v128),
                first_vector: first_channel / 8,
            })
        }
    }

    /// Codes of group `g` of `row` in 16-bit lanes.
    #[inline(always)]
    fn codes8(&self, row: &[u8], g: usize) -> v128 {
        let (start, ctrl) = self.loads[g];
        let bytes = &row[start..start + 16];
        // SAFETY: `bytes` is 16 bytes long.
        let word = unsafe { v128_load(bytes.as_ptr() as *const v128) };
        let windows = i8x16_swizzle(word, ctrl);
        v128_and(u16x8_shr(i16x8_mul(windows, self.mul), 8), self.mask)
    }

    /// Writes the group's int16 levels of `row` into `levels`, from `first_vector` on.
    #[inline(always)]
    fn place(&self, row: &[u8], levels: &mut [v128]) {
        let levels = &mut levels[self.first_vector..self.first_vector + self.groups];
        let mut g = 0;
        while g + 1 < self.groups {
            // Codes are below 16: narrowing keeps them, and each is its level's index.
            let idx = u8x16_narrow_i16x8(self.codes8(row, g), self.codes8(row, g + 1));
            let bytes = i8x16_swizzle(self.table, idx);
            levels[g] = i16x8_extend_low_i8x16(bytes);
            levels[g + 1] = i16x8_extend_high_i8x16(bytes);
            g += 2;
        }
        if g < self.groups {
            let codes = self.codes8(row, g);
            let bytes = i8x16_swizzle(self.table, u8x16_narrow_i16x8(codes, codes));
            levels[g] = i16x8_extend_low_i8x16(bytes);
        }
    }
}

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
