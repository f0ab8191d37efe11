//! AVX2 / AVX-512 batched matmul: register tiles of weight rows × tokens, each output the
//! canonical 16-lane dot product (see `crate::canon`) held as one `Vector::Sum` (two ymm or
//! one zmm), zero-filled tail. Tile sizes per width ([`Tiles`]): AVX2 2 rows × 2 tokens
//! (8 accumulators + 4 widened weight vectors + the activations fit the 16 ymm registers);
//! AVX-512 4 × 6 (24 accumulators + 4 weight vectors + 1 activation vector of the 32 zmm).
//! On AVX-512, f16/bf16 row blocks are widened to f32 once per token block into an L1-sized
//! buffer, so the inner loop is loads and FMAs only (widening is exact: outputs do not change).

use super::TileArgs;
use crate::simd::x86::{blocks, on_width, Vector};
use crate::simd::Lanes;
use crate::WeightRef;
use std::arch::x86_64::{__m256, __m512};
use std::ops::Range;

crate::isa::x86_kernels! {
    fn matmul(w: WeightRef<'_>, k: usize, x: &[f32], rows: Range<usize>, y: &mut [f32]);
    /// One register tile of `nr` rows × `nt` tokens (see [`TileArgs`] for the pointers).
    /// Entry points of their own: the closure `matmul_lanes` hands `for_each_tile` has no
    /// target features, so it calls these rather than inlining intrinsics.
    fn tiles<L: Lanes>(nr: usize, nt: usize, w: *const L, x: *const f32, y: *mut f32, k: usize, y_stride: usize);
    fn widen_rows<L: Lanes>(src: *const L, n: usize, dst: *mut f32);
}

/// A width's register tile (`ROWS` × `TOKENS`) and its instantiations.
trait Tiles: Vector {
    const ROWS: usize;
    const TOKENS: usize;
    /// Whether f16/bf16 row blocks are widened once per token block.
    const WIDEN_ROWS: bool;
    /// The tile of `nr` rows × `nt` tokens (each `ROWS`/`TOKENS` or 1).
    ///
    /// # Safety
    /// As [`tile`].
    unsafe fn tile<L: Lanes>(nr: usize, nt: usize, a: TileArgs<L>);
}

/// Implements [`Tiles`] for a register type: its tile, whether it widens row blocks.
macro_rules! tiles {
    ($($reg:ty: $rows:literal x $tokens:literal, $widen:literal;)*) => {$(
        impl Tiles for $reg {
            const ROWS: usize = $rows;
            const TOKENS: usize = $tokens;
            const WIDEN_ROWS: bool = $widen;
            #[inline(always)]
            unsafe fn tile<L: Lanes>(nr: usize, nt: usize, a: TileArgs<L>) {
                // SAFETY: forwarded from the caller.
                unsafe {
                    match (nr, nt) {
                        ($rows, $tokens) => tile::<Self, L, $rows, $tokens>(a),
                        ($rows, _) => tile::<Self, L, $rows, 1>(a),
                        (_, $tokens) => tile::<Self, L, 1, $tokens>(a),
                        _ => tile::<Self, L, 1, 1>(a),
                    }
                }
            }
        }
    )*};
}

tiles! {
    __m256: 2 x 2, false;
    __m512: 4 x 6, true;
}

/// # Safety
/// `V`'s features; shapes as checked by `super::check_shapes`.
#[inline(always)]
unsafe fn matmul<V: Tiles>(w: WeightRef<'_>, k: usize, x: &[f32], rows: Range<usize>, y: &mut [f32]) {
    // SAFETY: `V`'s features (caller).
    unsafe {
        crate::weight::with_slice!(
            w,
            |w| matmul_lanes::<V, _>(w, k, x, rows, y),
            |q| crate::q8dot::matmul_on(V::ISA, q, k, x, rows, y)
        )
    }
}

/// # Safety
/// `V`'s features.
#[inline(always)]
unsafe fn matmul_lanes<V: Tiles, L: Lanes>(
    w: &[L],
    k: usize,
    x: &[f32],
    rows: Range<usize>,
    y: &mut [f32],
) {
    super::check_shapes_generic(w.len(), k, x, &rows, y);
    let n_tokens = x.len() / k;
    let n_out = rows.len();
    let first = rows.start;
    // The ROWS-row block last widened into `wide` (f32 weights need no copy).
    let mut wide = if V::WIDEN_ROWS && !L::IS_F32 {
        vec![0.0f32; V::ROWS * k]
    } else {
        Vec::new()
    };
    let mut wide_rows = usize::MAX;
    super::for_each_tile(rows, n_tokens, k, V::ROWS, V::TOKENS, |r, nr, t, nt| {
        // SAFETY: the tile's rows and tokens lie inside w, x and y (checked shapes), `wide`
        // holds ROWS rows of k, and the CPU has `V`'s features.
        unsafe {
            let y = y.as_mut_ptr().add(t * n_out + (r - first));
            let x = x.as_ptr().add(t * k);
            if nr == V::ROWS && !wide.is_empty() {
                if wide_rows != r {
                    let (src, dst) = (w.as_ptr().add(r * k), wide.as_mut_ptr());
                    on_width!(V, matmul::widen_rows(src, V::ROWS * k, dst));
                    wide_rows = r;
                }
                return on_width!(V, matmul::tiles(nr, nt, wide.as_ptr(), x, y, k, n_out));
            }
            on_width!(V, matmul::tiles(nr, nt, w.as_ptr().add(r * k), x, y, k, n_out))
        }
    });
}

/// The tile of `nr` × `nt` at `w`, `x`, `y` (as in [`TileArgs`]).
///
/// # Safety
/// As [`tile`].
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn tiles<V: Tiles, L: Lanes>(
    nr: usize,
    nt: usize,
    w: *const L,
    x: *const f32,
    y: *mut f32,
    k: usize,
    y_stride: usize,
) {
    // SAFETY: forwarded from the caller.
    unsafe { V::tile::<L>(nr, nt, TileArgs { w, x, y, k, y_stride }) }
}

/// `dst[..n]` = `src[..n]` widened to f32.
///
/// # Safety
/// `V`'s features; `src` readable and `dst` writable for `n` elements.
#[inline(always)]
unsafe fn widen_rows<V: Vector, L: Lanes>(src: *const L, n: usize, dst: *mut f32) {
    for (i, nb) in blocks::<V>(n) {
        // SAFETY: the mask keeps both accesses below n.
        unsafe { V::store_masked(dst.add(i), V::mask(nb), V::widen_part(src.add(i), nb)) };
    }
}

/// # Safety
/// `V`'s features; pointers valid for R rows / T tokens of `k` elements and the T×R outputs.
// Index loops over the register tile: const bounds, fully unrolled, arrays stay in registers.
#[allow(clippy::needless_range_loop)]
#[inline(always)]
unsafe fn tile<V: Vector, L: Lanes, const R: usize, const T: usize>(a: TileArgs<L>) {
    let k = a.k;
    // SAFETY: whole blocks end at kk + 16 <= k, the partial one reads only below k, in every
    // row / token; output (t, i) is inside the tile the caller vouched for.
    unsafe {
        let mut acc = [[V::sum_zero(); T]; R];
        let k16 = k / 16 * 16;
        for kk in (0..k16).step_by(16) {
            block::<V, L, R, T>(&mut acc, &a, kk, 16);
        }
        if k16 < k {
            block::<V, L, R, T>(&mut acc, &a, k16, k - k16);
        }
        for i in 0..R {
            for t in 0..T {
                *a.y.add(t * a.y_stride + i) = V::reduce(acc[i][t]);
            }
        }
    }
}

/// Adds the block of `n` (16, or fewer at the end) elements at `kk` of every row and token
/// of the tile to its sums.
///
/// # Safety
/// As [`tile`]; `kk + n <= k`.
#[allow(clippy::needless_range_loop)]
#[inline(always)]
unsafe fn block<V: Vector, L: Lanes, const R: usize, const T: usize>(
    acc: &mut [[V::Sum; T]; R],
    a: &TileArgs<L>,
    kk: usize,
    n: usize,
) {
    // SAFETY: whole blocks end at kk + 16 <= k, a partial one reads only below k.
    unsafe {
        let mut wv = [V::sum_zero(); R];
        for i in 0..R {
            let p = a.w.add(i * a.k + kk);
            wv[i] = if n == 16 { V::sum_widen(p) } else { V::sum_widen_part(p, n) };
        }
        for t in 0..T {
            let p = a.x.add(t * a.k + kk);
            let xv = if n == 16 { V::sum_widen(p) } else { V::sum_widen_part(p, n) };
            for i in 0..R {
                acc[i][t] = V::sum_fma(wv[i], xv, acc[i][t]);
            }
        }
    }
}
