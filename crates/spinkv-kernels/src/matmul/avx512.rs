//! AVX-512 batched matmul: register tiles of 4 weight rows × 6 tokens (24 accumulators + 4
//! widened weight vectors + 1 activation vector of the 32 zmm registers), vectorised along k,
//! masked tail; each output is the canonical 16-lane dot product (see `crate::canon`).
//! f16/bf16 row blocks are widened to f32 once per token block into an L1-sized buffer, so the
//! inner loop is loads and FMAs only (widening is exact: the outputs do not change).

use crate::simd::avx512::{reduce16, tail_mask, Lanes};
use crate::WeightRef;
use std::arch::x86_64::*;
use std::ops::Range;

const ROWS: usize = 4;
const TOKENS: usize = 6;

/// # Safety
/// CPU must support AVX-512 F/BW/VL (+AVX2/FMA/F16C); shapes as `super::check_shapes`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
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

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
unsafe fn matmul_lanes<L: Lanes>(w: &[L], k: usize, x: &[f32], rows: Range<usize>, y: &mut [f32]) {
    super::check_shapes_generic(w.len(), k, x, &rows, y);
    let n_tokens = x.len() / k;
    let n_out = rows.len();
    let first = rows.start;
    // The ROWS-row block last widened into `wide` (f32 weights need no copy).
    let mut wide = if L::IS_F32 {
        Vec::new()
    } else {
        vec![0.0f32; ROWS * k]
    };
    let mut wide_rows = usize::MAX;
    super::for_each_tile(rows, n_tokens, k, ROWS, TOKENS, |r, nr, t, nt| {
        // SAFETY: the tile's rows and tokens lie inside w, x and y (checked shapes), `wide`
        // holds ROWS rows of k, and the CPU has the target features of this function.
        unsafe {
            let y = y.as_mut_ptr().add(t * n_out + (r - first));
            let x = x.as_ptr().add(t * k);
            if nr == ROWS && !wide.is_empty() {
                if wide_rows != r {
                    widen_rows(w.as_ptr().add(r * k), ROWS * k, wide.as_mut_ptr());
                    wide_rows = r;
                }
                let args = TileArgs {
                    w: wide.as_ptr(),
                    x,
                    y,
                    k,
                    y_stride: n_out,
                };
                return match nt {
                    TOKENS => tile::<f32, ROWS, TOKENS>(args),
                    _ => tile::<f32, ROWS, 1>(args),
                };
            }
            let args = TileArgs {
                w: w.as_ptr().add(r * k),
                x,
                y,
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

/// `dst[..n]` = `src[..n]` widened to f32.
///
/// # Safety
/// AVX-512; `src` readable and `dst` writable for `n` elements.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
unsafe fn widen_rows<L: Lanes>(src: *const L, n: usize, dst: *mut f32) {
    let mut i = 0;
    while i < n {
        let m = tail_mask((n - i).min(16));
        // SAFETY: the mask keeps both accesses below n.
        unsafe { _mm512_mask_storeu_ps(dst.add(i), m, L::load16_masked(src.add(i), m)) };
        i += 16;
    }
}

struct TileArgs<L> {
    w: *const L,
    x: *const f32,
    y: *mut f32,
    k: usize,
    y_stride: usize,
}

/// # Safety
/// AVX-512; pointers valid for R rows / T tokens of `k` elements and the T×R outputs.
#[allow(clippy::needless_range_loop)]
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
unsafe fn tile<L: Lanes, const R: usize, const T: usize>(a: TileArgs<L>) {
    let k = a.k;
    let mut acc = [[_mm512_setzero_ps(); T]; R];
    let mut kk = 0;
    while kk < k {
        let m = tail_mask((k - kk).min(16));
        // SAFETY: masked lanes stay below k within every row / token.
        unsafe {
            let mut wv = [_mm512_setzero_ps(); R];
            for (i, wv) in wv.iter_mut().enumerate() {
                *wv = L::load16_masked(a.w.add(i * k + kk), m);
            }
            for t in 0..T {
                let xv = _mm512_maskz_loadu_ps(m, a.x.add(t * k + kk));
                for i in 0..R {
                    acc[i][t] = _mm512_fmadd_ps(wv[i], xv, acc[i][t]);
                }
            }
        }
        kk += 16;
    }
    for i in 0..R {
        for t in 0..T {
            // SAFETY: output (t, i) is inside the tile the caller vouched for.
            unsafe { *a.y.add(t * a.y_stride + i) = reduce16(acc[i][t]) };
        }
    }
}
