//! AVX2/FMA/F16C matvec: 4 rows per pass, 2 accumulators per row (16 lanes of k per step), so
//! one activation load feeds 8 FMAs and 8 independent dependency chains hide FMA latency.

use crate::simd::avx2::{hsum, Lanes};
use std::arch::x86_64::*;
use std::ops::Range;

const ROWS: usize = 4;

/// # Safety
/// CPU must support AVX2+FMA+F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn matvec<L: Lanes>(
    w: &[L],
    k: usize,
    x: &[f32],
    rows: Range<usize>,
    y: &mut [f32],
) {
    super::check_shapes(w.len(), k, x, &rows, y);
    let mut r = rows.start;
    let mut out = 0;
    while r + ROWS <= rows.end {
        // SAFETY: rows r..r+4 are < rows.end, inside w per the shape check; out+4 <= y.len().
        unsafe { rows_block::<L, ROWS>(w.as_ptr().add(r * k), k, x, &mut y[out..out + ROWS]) };
        r += ROWS;
        out += ROWS;
    }
    while r < rows.end {
        // SAFETY: row r < rows.end is inside w.
        unsafe { rows_block::<L, 1>(w.as_ptr().add(r * k), k, x, &mut y[out..out + 1]) };
        r += 1;
        out += 1;
    }
}

/// # Safety
/// AVX2+FMA+F16C; `w` valid for `R` rows of `k` elements; `x.len() == k`; `y.len() == R`.
// Index loops over the register tile: const bounds, fully unrolled, arrays stay in registers.
#[allow(clippy::needless_range_loop)]
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn rows_block<L: Lanes, const R: usize>(w: *const L, k: usize, x: &[f32], y: &mut [f32]) {
    let xp = x.as_ptr();
    let mut acc0 = [_mm256_setzero_ps(); R];
    let mut acc1 = [_mm256_setzero_ps(); R];
    let k16 = k / 16 * 16;
    let k8 = k / 8 * 8;
    let mut kk = 0;
    // SAFETY (all blocks below): each load reads lanes kk..kk+8 or kk+8..kk+16 with
    // kk + 16 <= k (or kk + 8 <= k), so it stays inside its row of w and inside x.
    while kk < k16 {
        unsafe {
            let x0 = _mm256_loadu_ps(xp.add(kk));
            let x1 = _mm256_loadu_ps(xp.add(kk + 8));
            for i in 0..R {
                let row = w.add(i * k + kk);
                acc0[i] = _mm256_fmadd_ps(L::load8(row), x0, acc0[i]);
                acc1[i] = _mm256_fmadd_ps(L::load8(row.add(8)), x1, acc1[i]);
            }
        }
        kk += 16;
    }
    if kk < k8 {
        unsafe {
            let x0 = _mm256_loadu_ps(xp.add(kk));
            for i in 0..R {
                acc0[i] = _mm256_fmadd_ps(L::load8(w.add(i * k + kk)), x0, acc0[i]);
            }
        }
        kk += 8;
    }
    for i in 0..R {
        let mut sum = hsum(_mm256_add_ps(acc0[i], acc1[i]));
        for (j, xj) in x.iter().enumerate().skip(kk) {
            // SAFETY: j < k, inside row i.
            sum += unsafe { (*w.add(i * k + j)).widen() } * xj;
        }
        y[i] = sum;
    }
}
