//! AVX2/FMA/F16C batched matmul: register tiles of 2 weight rows × 2 tokens. Each output is
//! the canonical 16-lane dot product (see `crate::canon`), held as two 8-lane accumulators:
//! 8 accumulators + 4 widened weight vectors + the activations fit the 16 ymm registers, and
//! each widened weight vector feeds 2 FMAs.

use crate::simd::avx2::{reduce16, tail_mask, Lanes};
use crate::WeightRef;
use std::arch::x86_64::*;
use std::ops::Range;

const ROWS: usize = 2;
const TOKENS: usize = 2;

/// # Safety
/// CPU must support AVX2+FMA+F16C; shapes as checked by `super::check_shapes`.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn matmul(w: WeightRef<'_>, k: usize, x: &[f32], rows: Range<usize>, y: &mut [f32]) {
    // SAFETY: same target features as this function.
    unsafe {
        match w {
            WeightRef::F16(w) => matmul_lanes(w, k, x, rows, y),
            WeightRef::Bf16(w) => matmul_lanes(w, k, x, rows, y),
            WeightRef::F32(w) => matmul_lanes(w, k, x, rows, y),
        }
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn matmul_lanes<L: Lanes>(w: &[L], k: usize, x: &[f32], rows: Range<usize>, y: &mut [f32]) {
    super::check_shapes_generic(w.len(), k, x, &rows, y);
    let n_tokens = x.len() / k;
    let n_out = rows.len();
    let first = rows.start;
    super::for_each_tile(rows, n_tokens, k, ROWS, TOKENS, |r, nr, t, nt| {
        // SAFETY: the tile's rows and tokens lie inside w, x and y (checked shapes), and the
        // CPU has the target features of this function.
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
    /// First weight row of the tile; rows are `k` apart.
    w: *const L,
    /// First token of the tile; tokens are `k` apart.
    x: *const f32,
    /// Output for (first token, first row); tokens are `y_stride` apart, rows adjacent.
    y: *mut f32,
    k: usize,
    y_stride: usize,
}

/// # Safety
/// AVX2+FMA+F16C; pointers valid for R rows / T tokens of `k` elements and the T×R outputs.
// Index loops over the register tile: const bounds, fully unrolled, arrays stay in registers.
#[allow(clippy::needless_range_loop)]
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn tile<L: Lanes, const R: usize, const T: usize>(a: TileArgs<L>) {
    let k = a.k;
    let k16 = k / 16 * 16;
    let zero = _mm256_setzero_ps();
    // [row][token] × (lanes 0..8, lanes 8..16)
    let mut lo = [[zero; T]; R];
    let mut hi = [[zero; T]; R];
    let mut kk = 0;
    while kk < k16 {
        // SAFETY: kk + 16 <= k, so every load stays within its row / token.
        unsafe {
            let mut wl = [zero; R];
            let mut wh = [zero; R];
            for i in 0..R {
                wl[i] = L::load8(a.w.add(i * k + kk));
                wh[i] = L::load8(a.w.add(i * k + kk + 8));
            }
            for t in 0..T {
                let xl = _mm256_loadu_ps(a.x.add(t * k + kk));
                let xh = _mm256_loadu_ps(a.x.add(t * k + kk + 8));
                for i in 0..R {
                    lo[i][t] = _mm256_fmadd_ps(wl[i], xl, lo[i][t]);
                    hi[i][t] = _mm256_fmadd_ps(wh[i], xh, hi[i][t]);
                }
            }
        }
        kk += 16;
    }
    if k16 < k {
        // The last partial block of 16: zero-padded weights, masked activations.
        let rem = k - k16;
        let (m_lo, m_hi) = (tail_mask(rem.min(8)), tail_mask(rem.saturating_sub(8)));
        for i in 0..R {
            let mut row = [0.0f32; 16];
            for (j, v) in row.iter_mut().enumerate().take(rem) {
                // SAFETY: k16 + j < k, inside the row.
                *v = unsafe { (*a.w.add(i * k + k16 + j)).widen() };
            }
            // SAFETY: 16-element local array; masked loads stay below k in each token.
            unsafe {
                let wl = _mm256_loadu_ps(row.as_ptr());
                let wh = _mm256_loadu_ps(row.as_ptr().add(8));
                for t in 0..T {
                    let xl = _mm256_maskload_ps(a.x.add(t * k + k16), m_lo);
                    let xh = _mm256_maskload_ps(a.x.add(t * k + k16 + 8), m_hi);
                    lo[i][t] = _mm256_fmadd_ps(wl, xl, lo[i][t]);
                    hi[i][t] = _mm256_fmadd_ps(wh, xh, hi[i][t]);
                }
            }
        }
    }
    for i in 0..R {
        for t in 0..T {
            // SAFETY: output (t, i) is inside the tile the caller vouched for.
            unsafe { *a.y.add(t * a.y_stride + i) = reduce16(lo[i][t], hi[i][t]) };
        }
    }
}
