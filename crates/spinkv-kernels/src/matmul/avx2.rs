//! AVX2/FMA/F16C batched matmul.
//!
//! Register tile: `ROWS` weight rows × `TOKENS` tokens of accumulators, vectorised along k.
//! 3 rows × 4 tokens uses 12 accumulators + 3 widened weight vectors + 1 activation vector =
//! all 16 ymm registers; each widened weight vector feeds 4 FMAs.

use crate::simd::avx2::{hsum, Lanes};
use std::arch::x86_64::*;
use std::ops::Range;

const ROWS: usize = 3;
const TOKENS: usize = 4;

/// # Safety
/// CPU must support AVX2+FMA+F16C; shapes as checked by `super::check_shapes`.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn matmul<L: Lanes>(
    w: &[L],
    k: usize,
    x: &[f32],
    rows: Range<usize>,
    y: &mut [f32],
) {
    super::check_shapes_generic(w.len(), k, x, &rows, y);
    let n_tokens = x.len() / k;
    let n_out = rows.len();
    let mut r = rows.start;
    while r < rows.end {
        let row_block = ROWS.min(rows.end - r);
        let mut t = 0;
        while t < n_tokens {
            let token_block = TOKENS.min(n_tokens - t);
            // SAFETY: r + row_block <= rows.end <= n_rows and t + token_block <= n_tokens, so
            // every row/token the tile touches lies inside w, x and y (checked shapes).
            unsafe {
                let args = TileArgs {
                    w: w.as_ptr().add(r * k),
                    x: x.as_ptr().add(t * k),
                    y: y.as_mut_ptr().add(t * n_out + (r - rows.start)),
                    k,
                    y_stride: n_out,
                };
                match (row_block, token_block) {
                    (3, 4) => tile::<L, 3, 4>(args),
                    (3, 3) => tile::<L, 3, 3>(args),
                    (3, 2) => tile::<L, 3, 2>(args),
                    (3, 1) => tile::<L, 3, 1>(args),
                    (2, 4) => tile::<L, 2, 4>(args),
                    (2, 3) => tile::<L, 2, 3>(args),
                    (2, 2) => tile::<L, 2, 2>(args),
                    (2, 1) => tile::<L, 2, 1>(args),
                    (1, 4) => tile::<L, 1, 4>(args),
                    (1, 3) => tile::<L, 1, 3>(args),
                    (1, 2) => tile::<L, 1, 2>(args),
                    _ => tile::<L, 1, 1>(args),
                }
            }
            t += token_block;
        }
        r += row_block;
    }
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
    let k_vec = k / 8 * 8;
    let mut acc = [[_mm256_setzero_ps(); T]; R];
    let mut kk = 0;
    while kk < k_vec {
        // SAFETY: kk + 8 <= k, so every 8-lane load stays within its row / token.
        unsafe {
            let mut wv = [_mm256_setzero_ps(); R];
            for (i, wv) in wv.iter_mut().enumerate() {
                *wv = L::load8(a.w.add(i * k + kk));
            }
            for t in 0..T {
                let xv = _mm256_loadu_ps(a.x.add(t * k + kk));
                for i in 0..R {
                    acc[i][t] = _mm256_fmadd_ps(wv[i], xv, acc[i][t]);
                }
            }
        }
        kk += 8;
    }
    for i in 0..R {
        for t in 0..T {
            let mut sum = hsum(acc[i][t]);
            // SAFETY: the tail indices k_vec..k are inside the row / token; the output
            // (t, i) is inside the tile the caller vouched for.
            unsafe {
                for j in k_vec..k {
                    sum += (*a.w.add(i * k + j)).widen() * *a.x.add(t * k + j);
                }
                *a.y.add(t * a.y_stride + i) = sum;
            }
        }
    }
}
