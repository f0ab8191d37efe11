//! WASM SIMD128 steps of the 4-lane integer key scan (`quad.rs`): int16 products summed into
//! int32 lanes by `i32x4.dot_i16x8_s`, four rows' sums reduced by one transposing reduction.

use core::arch::wasm32::*;

use crate::codes::quad::Levels8;

/// Four int32 partial sums of one row (their total is the row's sum).
pub(super) type Sums = v128;

#[inline(always)]
pub(super) fn zero_sums() -> Sums {
    i32x4_splat(0)
}

#[inline(always)]
pub(super) fn load_query8(q: &[i16; 8]) -> Levels8 {
    // SAFETY: reads the 8 int16s of `q` (`v128_load` takes any alignment).
    unsafe { v128_load(q.as_ptr() as *const v128) }
}

/// `acc` plus the products of 8 levels and 8 query coordinates, in int32 lanes.
#[inline(always)]
pub(super) fn dot_add(acc: Sums, levels: Levels8, q: Levels8) -> Sums {
    i32x4_add(acc, i32x4_dot_i16x8(levels, q))
}

/// Lane `r` of the result: the sum of the four int32 lanes of `v[r]` (wrapping, as the
/// scalar reference's sum).
#[inline(always)]
pub(super) fn transpose_sum(v: [Sums; 4]) -> Sums {
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

/// `super::epilogue` of four rows: `(factor · sum) · scale` per lane.
#[inline(always)]
pub(super) fn scores4(factor: f32, sums: Sums, scales: &[f32; 4]) -> [f32; 4] {
    let mut out = [0.0f32; 4];
    // SAFETY: reads the 4 floats of `scales`, writes the 4 of a local array.
    unsafe {
        let s = v128_load(scales.as_ptr() as *const v128);
        let x = f32x4_mul(f32x4_mul(f32x4_splat(factor), f32x4_convert_i32x4(sums)), s);
        v128_store(out.as_mut_ptr() as *mut v128, x);
    }
    out
}

#[inline(always)]
pub(super) fn lanes(sums: Sums) -> [i32; 4] {
    let mut out = [0i32; 4];
    // SAFETY: writes the 4 int32s of a local array.
    unsafe { v128_store(out.as_mut_ptr() as *mut v128, sums) };
    out
}
