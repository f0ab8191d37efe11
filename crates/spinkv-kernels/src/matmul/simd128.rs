//! WASM SIMD128 register tile for `quad.rs`: 2 weight rows × 4 tokens (8 accumulators:
//! engines map v128 onto 16 xmm registers), vectorised along k, multiply and add unfused (no
//! FMA).

use super::Lanes;
use crate::matmul::TileArgs;
use crate::simd::simd128::hsum;
use core::arch::wasm32::*;

pub(super) const ROWS: usize = 2;
pub(super) const TOKENS: usize = 4;

/// # Safety
/// Pointers valid for R rows / T tokens of `k` elements and the T×R outputs.
#[allow(clippy::needless_range_loop)]
#[inline(always)]
pub(super) unsafe fn tile<L: Lanes, const R: usize, const T: usize>(a: TileArgs<L>) {
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
