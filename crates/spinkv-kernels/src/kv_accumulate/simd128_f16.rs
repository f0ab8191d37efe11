//! The SIMD128 fp16 value scan: 8 channels at a time, a tile of up to 4 query heads' sums of
//! them stay in registers across all the rows; each row's 8 halves are widened once for the
//! tile (shift, mask, one exact multiply by 2^112: `simd::simd128`'s `halves_times_2_pow_m112`,
//! as the f16 matvec widens weights; exact for every finite half), then added times each head's
//! weight.
//!
//! Every sum element takes the generic row loop's additions (`vec_f32::quad::axpy`:
//! `acc + w · v`, unfused) in the same row order, and skips the same zero weights: the same
//! bits. A block of 8 channels holding an inf or NaN half is summed again from its start with
//! the general widening (`simd::simd128::f16_bits_to_f32`, what `convert::quad::f16_to_f32`
//! gives the row loop); head dims that are not a multiple of 8 take the row loop.

use crate::simd::simd128::{
    f16_bits_to_f32, halves_finite, halves_times_2_pow_m112, note_halves, times_2_pow_112,
};
use core::arch::wasm32::*;
use half::f16;

/// Query heads whose sums of 8 channels stay in registers.
const TILE_Q: usize = 4;

/// Whether [`accumulate_f16`] takes rows of `d` channels.
#[inline(always)]
pub(super) fn takes(d: usize) -> bool {
    d > 0 && d.is_multiple_of(8)
}

/// `accumulate_f16` for `d` that [`takes`].
///
/// # Safety
/// SIMD128; shapes as checked by `super::super::accumulate_f16`.
#[inline(always)]
pub(super) unsafe fn accumulate_f16(
    values: &[f16],
    d: usize,
    weights: &[f32],
    stride: usize,
    acc: &mut [f32],
) {
    debug_assert!(takes(d));
    let rows = values.len() / d;
    let n_qh = acc.len() / d;
    let bits = values.as_ptr() as *const u16;
    for h0 in (0..n_qh).step_by(TILE_Q) {
        let (w, a) = (
            // SAFETY: head h0's weight row starts inside `weights` (checked shapes).
            unsafe { weights.as_ptr().add(h0 * stride) },
            acc[h0 * d..].as_mut_ptr(),
        );
        // SAFETY (all four): SIMD128; the tile's heads' `rows` weights and `d` sums lie inside
        // `weights` and `acc`, the rows inside `values` (checked shapes).
        unsafe {
            match (n_qh - h0).min(TILE_Q) {
                4 => tile::<4>(bits, d, rows, w, stride, a),
                3 => tile::<3>(bits, d, rows, w, stride, a),
                2 => tile::<2>(bits, d, rows, w, stride, a),
                _ => tile::<1>(bits, d, rows, w, stride, a),
            }
        }
    }
}

/// `H` heads' sums (`acc`, rows `d` apart; weights `w`, rows `stride` apart) plus the `rows`
/// value rows' weighted halves, 8 channels at a time.
///
/// # Safety
/// SIMD128; `bits` valid for `rows` rows of `d` halves (`d` a multiple of 8), `w` for `H`
/// weight rows of `rows` floats, `acc` for `H` rows of `d` floats.
#[inline(always)]
unsafe fn tile<const H: usize>(
    bits: *const u16,
    d: usize,
    rows: usize,
    w: *const f32,
    stride: usize,
    acc: *mut f32,
) {
    // Without zero weights (decode's usual case) the rows add with no test per weight.
    // SAFETY: the heads' weights of the rows (the caller's bounds).
    let any_zero = (0..H).any(|h| (0..rows).any(|j| unsafe { *w.add(h * stride + j) } == 0.0));
    for c in (0..d).step_by(8) {
        let mut sums = [[f32x4_splat(0.0); 2]; H];
        // SAFETY (all loads and stores): channels c..c + 8 of each head's sums and of each
        // row lie inside them, as the caller guarantees.
        unsafe {
            for (h, s) in sums.iter_mut().enumerate() {
                let at = acc.add(h * d + c);
                *s = [v128_load(at as *const v128), v128_load(at.add(4) as *const v128)];
            }
            let start = sums;
            let finite = if any_zero {
                add_rows::<H, false, true>(&mut sums, bits.add(c), d, rows, w, stride)
            } else {
                add_rows::<H, false, false>(&mut sums, bits.add(c), d, rows, w, stride)
            };
            if !finite {
                sums = start;
                add_rows::<H, true, true>(&mut sums, bits.add(c), d, rows, w, stride);
            }
            for (h, s) in sums.iter().enumerate() {
                let at = acc.add(h * d + c);
                v128_store(at as *mut v128, s[0]);
                v128_store(at.add(4) as *mut v128, s[1]);
            }
        }
    }
}

/// Adds 8 channels (from `bits`, rows `d` halves apart) of the `rows` rows to the `H` heads'
/// `sums`, each row times its weight unless that is 0 (tested only if `SKIP`: the caller found
/// a zero). Widens by shift, mask and multiply unless `GENERAL`: then `false` when some half
/// was inf or NaN (the sums are wrong).
///
/// # Safety
/// SIMD128; `bits` valid for 8 halves of each of the `rows` rows, `w` for `H` weight rows of
/// `rows` floats `stride` apart.
#[inline(always)]
unsafe fn add_rows<const H: usize, const GENERAL: bool, const SKIP: bool>(
    sums: &mut [[v128; 2]; H],
    bits: *const u16,
    d: usize,
    rows: usize,
    w: *const f32,
    stride: usize,
) -> bool {
    let mut largest = u16x8_splat(0);
    for j in 0..rows {
        // SAFETY: row j's 8 halves and the heads' weights of row j (caller's bounds).
        let h = unsafe { v128_load(bits.add(j * d) as *const v128) };
        let (lo, hi) = if GENERAL {
            (
                f16_bits_to_f32(u32x4_extend_low_u16x8(h)),
                f16_bits_to_f32(u32x4_extend_high_u16x8(h)),
            )
        } else {
            largest = note_halves(largest, h);
            let [lo, hi] = halves_times_2_pow_m112(h);
            (times_2_pow_112(lo), times_2_pow_112(hi))
        };
        for (i, s) in sums.iter_mut().enumerate() {
            // SAFETY: as above.
            let wt = unsafe { *w.add(i * stride + j) };
            if !SKIP || wt != 0.0 {
                let wv = f32x4_splat(wt);
                s[0] = f32x4_add(s[0], f32x4_mul(wv, lo));
                s[1] = f32x4_add(s[1], f32x4_mul(wv, hi));
            }
        }
    }
    GENERAL || halves_finite(largest)
}
