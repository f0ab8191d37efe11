//! WASM SIMD128 steps of the 4-lane integer-grid value scan (`quad.rs`): a pair of rows'
//! int16 levels interleaved channel by channel, so one `i32x4.dot_i16x8_s` with the two rows'
//! grid weights adds both rows to four channels; the chunk's largest weight found four lanes at
//! a time.

use core::arch::wasm32::*;

use super::super::grid::CHUNK;
use crate::codes::quad::Levels8;

/// Sums of 8 channels: channels 0..4, then 4..8.
pub(super) type Sums = [v128; 2];
/// Two rows' levels of 8 channels, interleaved: channels 0..4, then 4..8.
pub(super) type Pair = (v128, v128);

#[inline(always)]
pub(super) fn zero_sums() -> v128 {
    i32x4_splat(0)
}

/// Interleaves the rows once for every head of a tile.
#[inline(always)]
pub(super) fn pair(a: Levels8, b: Levels8) -> Pair {
    (
        i16x8_shuffle::<0, 8, 1, 9, 2, 10, 3, 11>(a, b),
        i16x8_shuffle::<4, 12, 5, 13, 6, 14, 7, 15>(a, b),
    )
}

/// `sums` plus the pair's levels times their grid weights, `weights` holding the first row's in
/// its low 16 bits and the second's in its high 16.
#[inline(always)]
pub(super) fn add_pair(sums: &mut Sums, (low, high): Pair, weights: i32) {
    let w = i32x4_splat(weights);
    sums[0] = i32x4_add(sums[0], i32x4_dot_i16x8(low, w));
    sums[1] = i32x4_add(sums[1], i32x4_dot_i16x8(high, w));
}

/// The 8 sums as f32 (exact: below 2^24).
#[inline(always)]
pub(super) fn to_f32(sums: Sums) -> [f32; 8] {
    let mut out = [0.0f32; 8];
    // SAFETY: writes the 8 floats of a local array.
    unsafe {
        let at = out.as_mut_ptr();
        v128_store(at as *mut v128, f32x4_convert_i32x4(sums[0]));
        v128_store(at.add(4) as *mut v128, f32x4_convert_i32x4(sums[1]));
    }
    out
}

/// The largest `|w|` four lanes at a time: `f32::max` compiles to a call of libm's `fmaxf` on
/// wasm32 (its NaN rule is not `f32x4.max`'s), which took ~5 % of a browser decode at depth
/// 4,096. For finite weights the same largest value as `grid::quantize_chunk`'s fold.
#[inline(always)]
pub(super) fn largest_magnitude(ws: &[f32; CHUNK]) -> f32 {
    let mut m = f32x4_splat(0.0);
    for four in ws.chunks_exact(4) {
        // SAFETY: `four` holds 4 floats (`v128_load` takes any alignment).
        let v = unsafe { v128_load(four.as_ptr() as *const v128) };
        m = f32x4_max(m, f32x4_abs(v));
    }
    let m = f32x4_max(m, i32x4_shuffle::<2, 3, 0, 1>(m, m));
    let m = f32x4_max(m, i32x4_shuffle::<1, 0, 3, 2>(m, m));
    f32x4_extract_lane::<0>(m)
}
