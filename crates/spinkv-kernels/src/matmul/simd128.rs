//! WASM SIMD128 batched matmul: register tiles of 2 weight rows × 4 tokens (8 accumulators: engines map v128 onto 16 xmm registers), vectorised along k.

use crate::simd::simd128::{hsum, Lanes};
use crate::WeightRef;
use core::arch::wasm32::*;
use std::ops::Range;

const ROWS: usize = 2;
const TOKENS: usize = 4;

/// # Safety
/// Shapes as checked by `super::check_shapes`.
pub unsafe fn matmul(w: WeightRef<'_>, k: usize, x: &[f32], rows: Range<usize>, y: &mut [f32]) {
    crate::weight::with_slice!(w, |w| matmul_lanes(w, k, x, rows, y))
}

fn matmul_lanes<L: Lanes>(w: &[L], k: usize, x: &[f32], rows: Range<usize>, y: &mut [f32]) {
    super::check_shapes_generic(w.len(), k, x, &rows, y);
    let n_tokens = x.len() / k;
    let n_out = rows.len();
    let first = rows.start;
    super::for_each_tile(rows, n_tokens, k, ROWS, TOKENS, |r, nr, t, nt| {
        // SAFETY: the tile's rows and tokens lie inside w, x and y (checked shapes).
        unsafe {
            let args = TileArgs {
                w: w.as_ptr().add(r * k),
                x: x.as_ptr().add(t * k),
                y: y.as_mut_ptr().add(t * n_out + (r - first)),
                k,
                y_stride: n_out,
            };
            match (nr, nt) {
                (ROWS, TOKENS) => tile::<L, ROWS, TOKENS>(args),
                (ROWS, _) => tile::<L, ROWS, 1>(args),
                (_, TOKENS) => tile::<L, 1, TOKENS>(args),
                _ => tile::<L, 1, 1>(args),
            }
        }
    });
}

struct TileArgs<L> {
    w: *const L,
    x: *const f32,
    y: *mut f32,
    k: usize,
    y_stride: usize,
}

/// # Safety
/// Pointers valid for R rows / T tokens of `k` elements and the T×R outputs.
#[allow(clippy::needless_range_loop)]
#[inline(always)]
unsafe fn tile<L: Lanes, const R: usize, const T: usize>(a: TileArgs<L>) {
    let k = a.k;
    let k_vec = k / 4 * 4;
    let mut acc = [[f32x4_splat(0.0); T]; R];
    let mut kk = 0;
    while kk < k_vec {
        // SAFETY: kk + 4 <= k, so every 4-lane load stays within its row / token.
        unsafe {
            let mut wv = [f32x4_splat(0.0); R];
            for (i, wv) in wv.iter_mut().enumerate() {
                *wv = L::load4(a.w.add(i * k + kk));
            }
            for t in 0..T {
                let xv = v128_load(a.x.add(t * k + kk) as *const v128);
                for i in 0..R {
                    acc[i][t] = f32x4_add(acc[i][t], f32x4_mul(wv[i], xv));
                }
            }
        }
        kk += 4;
    }
    for i in 0..R {
        for t in 0..T {
            // SAFETY: register-only reduction; tail indices k_vec..k are inside the row and
            // token; output (t, i) is inside the tile the caller vouched for.
            unsafe {
                let mut sum = hsum(acc[i][t]);
                for j in k_vec..k {
                    sum += (*a.w.add(i * k + j)).widen() * *a.x.add(t * k + j);
                }
                *a.y.add(t * a.y_stride + i) = sum;
            }
        }
    }
}
