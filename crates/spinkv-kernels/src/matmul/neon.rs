//! NEON register tile for `quad.rs`: 2 weight rows × 2 tokens, each output the canonical
//! 16-lane dot product held as four 4-lane accumulators (16 accumulators + 8 widened weight
//! vectors + 1 activation vector of the 32 q registers; see `crate::canon`).

use super::Lanes;
use crate::matmul::TileArgs;
use crate::simd::neon::reduce16;
use core::arch::aarch64::*;

pub(super) const ROWS: usize = 2;
pub(super) const TOKENS: usize = 2;

/// # Safety
/// Pointers valid for R rows / T tokens of `k` elements and the T×R outputs.
#[allow(clippy::needless_range_loop)]
#[inline(always)]
pub(super) unsafe fn tile<L: Lanes, const R: usize, const T: usize>(a: TileArgs<L>) {
    let k = a.k;
    let k16 = k / 16 * 16;
    let zero = vdupq_n_f32(0.0);
    // [row][token][quad]: the canonical 16 lanes as four 4-lane accumulators.
    let mut acc = [[[zero; 4]; T]; R];
    let mut kk = 0;
    while kk < k16 {
        // SAFETY: kk + 16 <= k, so every load stays within its row / token.
        unsafe {
            let mut wv = [[zero; 4]; R];
            for i in 0..R {
                for q in 0..4 {
                    wv[i][q] = L::load4(a.w.add(i * k + kk + 4 * q));
                }
            }
            for t in 0..T {
                for q in 0..4 {
                    let xv = vld1q_f32(a.x.add(t * k + kk + 4 * q));
                    for i in 0..R {
                        acc[i][t][q] = vfmaq_f32(acc[i][t][q], wv[i][q], xv);
                    }
                }
            }
        }
        kk += 16;
    }
    if k16 < k {
        // The last partial block of 16 through zero-padded copies.
        let rem = k - k16;
        for i in 0..R {
            let mut row = [0.0f32; 16];
            for (j, v) in row.iter_mut().enumerate().take(rem) {
                // SAFETY: k16 + j < k, inside the row.
                *v = unsafe { (*a.w.add(i * k + k16 + j)).widen() };
            }
            for t in 0..T {
                let mut xs = [0.0f32; 16];
                // SAFETY: k16 + rem = k, inside the token.
                unsafe {
                    core::ptr::copy_nonoverlapping(a.x.add(t * k + k16), xs.as_mut_ptr(), rem)
                };
                for q in 0..4 {
                    // SAFETY: loads of local arrays.
                    unsafe {
                        let w = vld1q_f32(row.as_ptr().add(4 * q));
                        let x = vld1q_f32(xs.as_ptr().add(4 * q));
                        acc[i][t][q] = vfmaq_f32(acc[i][t][q], w, x);
                    }
                }
            }
        }
    }
    for i in 0..R {
        for t in 0..T {
            // SAFETY: register-only reduction; output (t, i) is inside the tile the caller
            // vouched for.
            unsafe { *a.y.add(t * a.y_stride + i) = reduce16(acc[i][t]) };
        }
    }
}
