//! AVX2/FMA/F16C matvec: one row at a time, streamed start to end with 4 independent
//! accumulators (32 lanes of k per step).
//!
//! Why not several rows per pass (sharing each activation load)? Measured on the 2-core dev
//! machine with a 49152×576 f16 matrix (DRAM-bound): 1 row/pass ~20–33 GB/s, 2–8 interleaved
//! rows/pass ~8–11 GB/s — the interleaved streams defeat the hardware prefetcher, and decode
//! speed is that bandwidth. The activation vector stays in L1 either way.

use crate::simd::avx2::{hsum, Lanes};
use std::arch::x86_64::*;
use std::ops::Range;

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
    for (out, r) in y.iter_mut().zip(rows) {
        // SAFETY: r < rows.end, so row r (k elements) lies inside w per the shape check.
        *out = unsafe { row_dot(w.as_ptr().add(r * k), x) };
    }
}

/// # Safety
/// AVX2+FMA+F16C; `row` valid for `x.len()` elements.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn row_dot<L: Lanes>(row: *const L, x: &[f32]) -> f32 {
    let k = x.len();
    let xp = x.as_ptr();
    let mut acc = [_mm256_setzero_ps(); 4];
    let mut kk = 0;
    // SAFETY (both loops): each 8-lane load covers kk..kk+8 (or up to kk+32) <= k, inside the
    // row and inside x.
    while kk + 32 <= k {
        unsafe {
            for (j, acc) in acc.iter_mut().enumerate() {
                let offset = kk + 8 * j;
                *acc = _mm256_fmadd_ps(
                    L::load8(row.add(offset)),
                    _mm256_loadu_ps(xp.add(offset)),
                    *acc,
                );
            }
        }
        kk += 32;
    }
    while kk + 8 <= k {
        unsafe {
            acc[0] = _mm256_fmadd_ps(L::load8(row.add(kk)), _mm256_loadu_ps(xp.add(kk)), acc[0]);
        }
        kk += 8;
    }
    let mut sum = hsum(_mm256_add_ps(
        _mm256_add_ps(acc[0], acc[1]),
        _mm256_add_ps(acc[2], acc[3]),
    ));
    for (j, xj) in x.iter().enumerate().skip(kk) {
        // SAFETY: j < k, inside the row.
        sum += unsafe { (*row.add(j)).widen() } * xj;
    }
    sum
}
