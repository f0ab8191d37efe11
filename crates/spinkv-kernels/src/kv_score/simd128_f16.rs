//! The SIMD128 fp16 key scan: blocks of 4 key rows widened once (shift, mask, one exact
//! multiply by 2^112: `simd::simd128`'s `halves_times_2_pow_m112`, as the f16 matvec widens weights: exact for every
//! finite half) into a stack buffer, then scored against every query head two rows at a time
//! (8 independent chains) and the block's 4 sums reduced together into one vector store.
//!
//! Each row's dot product adds in the order of the generic row loop's (`vec_f32::quad::dot`
//! on f32 rows): 4 chains over steps of 16 channels, steps of 4 into chain 0, the chains
//! summed `(c0 + c1) + (c2 + c3)`, then the lanes `(l0 + l2) + (l1 + l3)`: the same bits. A
//! block holding an inf or NaN half, the last `rows % 4` rows and head dims that are not a
//! multiple of 4 (or above [`MAX_DIM`]) take the generic row loop.

use crate::simd::simd128::{halves_finite, halves_times_2_pow_m112, note_halves, times_2_pow_112};
use core::arch::wasm32::*;
use core::mem::MaybeUninit;
use half::f16;

/// Largest head dim the block buffer holds.
pub(super) const MAX_DIM: usize = 256;
/// Rows widened and scored together.
const BLOCK: usize = 4;

/// Whether [`score_f16`] takes rows of `d` channels.
#[inline(always)]
pub(super) fn takes(d: usize) -> bool {
    d > 0 && d <= MAX_DIM && d.is_multiple_of(4)
}

/// `score_f16` for `d` that [`takes`]; `generic(keys, scores)` scores the rows of a block it
/// leaves (non-finite halves, the last `rows % 4` rows) into `scores` from the block's column.
///
/// # Safety
/// SIMD128; shapes as checked by `super::super::score_f16`.
#[inline(always)]
pub(super) unsafe fn score_f16(
    keys: &[f16],
    d: usize,
    queries: &[f32],
    scores: &mut [f32],
    stride: usize,
    generic: impl Fn(&[f16], &mut [f32]),
) {
    debug_assert!(takes(d));
    let rows = keys.len() / d;
    let n_qh = queries.len() / d;
    let vectors = d / 4;
    let mut buf = MaybeUninit::<[[v128; MAX_DIM / 4]; BLOCK]>::uninit();
    let buf = buf.as_mut_ptr() as *mut v128;
    let full = rows / BLOCK * BLOCK;
    for j0 in (0..full).step_by(BLOCK) {
        // SAFETY: rows j0..j0 + 4 lie inside `keys`; the buffer holds 4 rows of `MAX_DIM >= d`
        // channels, each written here before it is read below.
        let finite = unsafe { widen_block(keys.as_ptr().add(j0 * d) as *const u16, d, buf) };
        if !finite {
            generic(&keys[j0 * d..(j0 + BLOCK) * d], &mut scores[j0..]);
            continue;
        }
        for (qh, q) in queries.chunks_exact(d).enumerate() {
            // SAFETY: `q` holds `d` floats, the buffer the block's 4 widened rows; the 4 scores
            // at `qh · stride + j0` lie inside `scores` (`j0 + 4 <= rows`, checked shapes).
            unsafe {
                let s01 = pair_sums(q.as_ptr(), buf, buf.add(MAX_DIM / 4), vectors);
                let s23 = pair_sums(
                    q.as_ptr(),
                    buf.add(2 * MAX_DIM / 4),
                    buf.add(3 * MAX_DIM / 4),
                    vectors,
                );
                let sums = reduce4(s01, s23);
                v128_store(scores.as_mut_ptr().add(qh * stride + j0) as *mut v128, sums);
            }
        }
    }
    if full < rows && n_qh > 0 {
        generic(&keys[full * d..], &mut scores[full..]);
    }
}

/// Widens 4 rows of `d` halves from `bits` into `buf` (row `r` at `buf + r · MAX_DIM / 4`);
/// `false` when some half is inf or NaN (the buffer then holds wrong values for them).
///
/// # Safety
/// SIMD128; `bits` valid for 4 rows of `d` halves, `d` a multiple of 4 up to [`MAX_DIM`],
/// `buf` valid for writing 4 rows of `MAX_DIM / 4` vectors.
#[inline(always)]
unsafe fn widen_block(bits: *const u16, d: usize, buf: *mut v128) -> bool {
    let mut largest = u16x8_splat(0);
    for r in 0..BLOCK {
        // SAFETY (all loads and stores): channels k..k + 8 (or k..k + 4) of row r lie inside
        // the row and its buffer row, as the caller guarantees.
        unsafe {
            let (src, dst) = (bits.add(r * d), buf.add(r * (MAX_DIM / 4)));
            let mut k = 0;
            while k + 8 <= d {
                let h = v128_load(src.add(k) as *const v128);
                largest = note_halves(largest, h);
                let [lo, hi] = halves_times_2_pow_m112(h);
                *dst.add(k / 4) = times_2_pow_112(lo);
                *dst.add(k / 4 + 1) = times_2_pow_112(hi);
                k += 8;
            }
            if k < d {
                let h = v128_load64_zero(src.add(k) as *const u64);
                largest = note_halves(largest, h);
                *dst.add(k / 4) = times_2_pow_112(halves_times_2_pow_m112(h)[0]);
            }
        }
    }
    halves_finite(largest)
}

/// Two rows' dot products with `q`, each as the generic loop's 4 chains summed
/// `(c0 + c1) + (c2 + c3)` (before the lanes' sum): `[row a's lanes, row b's lanes]`.
///
/// # Safety
/// SIMD128; `q` valid for `4 · vectors` floats, `a` and `b` for `vectors` vectors.
#[inline(always)]
unsafe fn pair_sums(q: *const f32, a: *const v128, b: *const v128, vectors: usize) -> [v128; 2] {
    let mut ca = [f32x4_splat(0.0); 4];
    let mut cb = [f32x4_splat(0.0); 4];
    let mut v = 0;
    // SAFETY: every load is of a vector below `vectors` (the caller's bounds).
    unsafe {
        while v + 4 <= vectors {
            for c in 0..4 {
                let qv = v128_load(q.add(4 * (v + c)) as *const v128);
                ca[c] = f32x4_add(ca[c], f32x4_mul(qv, *a.add(v + c)));
                cb[c] = f32x4_add(cb[c], f32x4_mul(qv, *b.add(v + c)));
            }
            v += 4;
        }
        while v < vectors {
            let qv = v128_load(q.add(4 * v) as *const v128);
            ca[0] = f32x4_add(ca[0], f32x4_mul(qv, *a.add(v)));
            cb[0] = f32x4_add(cb[0], f32x4_mul(qv, *b.add(v)));
            v += 1;
        }
    }
    let fold = |c: [v128; 4]| f32x4_add(f32x4_add(c[0], c[1]), f32x4_add(c[2], c[3]));
    [fold(ca), fold(cb)]
}

/// The lanes' sums `(l0 + l2) + (l1 + l3)` of 4 rows' vectors, as lanes 0..4.
#[inline(always)]
fn reduce4([r0, r1]: [v128; 2], [r2, r3]: [v128; 2]) -> v128 {
    // [r0.l0 + r0.l2, r0.l1 + r0.l3, r1.l0 + r1.l2, r1.l1 + r1.l3], and so for rows 2, 3.
    let s01 = f32x4_add(
        i32x4_shuffle::<0, 1, 4, 5>(r0, r1),
        i32x4_shuffle::<2, 3, 6, 7>(r0, r1),
    );
    let s23 = f32x4_add(
        i32x4_shuffle::<0, 1, 4, 5>(r2, r3),
        i32x4_shuffle::<2, 3, 6, 7>(r2, r3),
    );
    f32x4_add(
        i32x4_shuffle::<0, 2, 4, 6>(s01, s23),
        i32x4_shuffle::<1, 3, 5, 7>(s01, s23),
    )
}
