//! AVX2 / AVX-512 batched matmul: register tiles of weight rows × tokens, each output the
//! canonical 16-lane dot product (see `crate::canon`), zero-filled tail.
//!
//! AVX2: the canonical lanes 0–7 and 8–15 of a dot product never meet before the final
//! reduction, so a tile runs the whole `k` loop twice, once per 8-lane half, and an output
//! needs one ymm accumulator at a time instead of two. The tile here is 3 rows × 3 tokens (9
//! accumulators, each weight widened once per 3 tokens, each activation vector reused by 3
//! rows; a 2 × 2 tile of two-register sums did 8 FMAs per 8 loads + 4 widenings); on f16
//! weights `avx2_f16`'s 4 × 3 tile runs instead, its loop in assembly because LLVM spilled
//! the intrinsics version's 12 accumulators. The second pass reads the tile's rows and tokens
//! from L1. Outputs are bit-identical to the scalar reference: every lane sees the same FMAs
//! in the same order.
//!
//! AVX-512: one zmm holds all 16 lanes; a 4 × 6 tile (24 accumulators + 4 weight vectors + 1
//! activation vector of the 32 zmm), each weight widened in the loop once per 6 tokens.
//!
//! Both widths walk the output as [`super::for_each_tile_rows_inner`] does: a token tile
//! sweeps an L2-sized block of weight rows while its activations stay in L1. (AVX-512 used to
//! widen f16 row blocks to f32 once per token block into a buffer and sweep tokens inside
//! rows; on Zen 4 widening in the loop with rows inside tokens ran 15–20 % faster.)

use super::avx2_f16;
use super::TileArgs;
use crate::simd::x86::{on_width, Vector};
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
}

/// A width's register tile (`ROWS` × `TOKENS`) and its instantiations.
trait Tiles: Vector {
    const ROWS: usize;
    const TOKENS: usize;
    /// The register tile for weights of type `L`: (rows, tokens).
    fn shape<L: Lanes>() -> (usize, usize) {
        (Self::ROWS, Self::TOKENS)
    }
    /// The tile of `nr` rows × `nt` tokens (each as [`Tiles::shape`] gives them, or 1).
    ///
    /// # Safety
    /// As [`tile`].
    unsafe fn tile<L: Lanes>(nr: usize, nt: usize, a: TileArgs<L>);
}

/// Implements [`Tiles`] for a register type: its tile and the tile body (`tile` for one
/// register per canonical sum, `tile_halves` for two).
macro_rules! tiles {
    ($($reg:ty: $rows:literal x $tokens:literal, $tile:ident;)*) => {$(
        impl Tiles for $reg {
            const ROWS: usize = $rows;
            const TOKENS: usize = $tokens;
            #[inline(always)]
            unsafe fn tile<L: Lanes>(nr: usize, nt: usize, a: TileArgs<L>) {
                // SAFETY: forwarded from the caller.
                unsafe {
                    match (nr, nt) {
                        ($rows, $tokens) => $tile::<Self, L, $rows, $tokens>(a),
                        ($rows, _) => $tile::<Self, L, $rows, 1>(a),
                        (_, $tokens) => $tile::<Self, L, 1, $tokens>(a),
                        _ => $tile::<Self, L, 1, 1>(a),
                    }
                }
            }
        }
    )*};
}

tiles! {
    __m512: 4 x 6, tile;
}

/// AVX2: 3 rows × 3 tokens, and on f16 weights [`avx2_f16`]'s 4 × 3 tile.
impl Tiles for __m256 {
    const ROWS: usize = 3;
    const TOKENS: usize = 3;
    fn shape<L: Lanes>() -> (usize, usize) {
        if L::IS_F16 {
            (avx2_f16::ROWS, avx2_f16::TOKENS)
        } else {
            (Self::ROWS, Self::TOKENS)
        }
    }
    #[inline(always)]
    unsafe fn tile<L: Lanes>(nr: usize, nt: usize, a: TileArgs<L>) {
        // SAFETY: forwarded from the caller; L is f16 where the f16 tile runs.
        unsafe {
            match (nr, nt) {
                (avx2_f16::ROWS, avx2_f16::TOKENS) if L::IS_F16 => {
                    avx2_f16::tile(a.w.cast(), a.x, a.y, a.k, a.y_stride)
                }
                (3, 3) => tile_halves::<Self, L, 3, 3>(a),
                (avx2_f16::ROWS, _) if L::IS_F16 => tile_halves::<Self, L, 4, 1>(a),
                (3, _) => tile_halves::<Self, L, 3, 1>(a),
                (_, 3) => tile_halves::<Self, L, 1, 3>(a),
                _ => tile_halves::<Self, L, 1, 1>(a),
            }
        }
    }
}

/// # Safety
/// `V`'s features; shapes as checked by `super::check_shapes`.
#[inline(always)]
unsafe fn matmul<V: Tiles>(
    w: WeightRef<'_>,
    k: usize,
    x: &[f32],
    rows: Range<usize>,
    y: &mut [f32],
) {
    // SAFETY: `V`'s features (caller).
    unsafe {
        crate::weight::with_slice!(w, |w| matmul_lanes::<V, _>(w, k, x, rows, y), |q| {
            crate::q8dot::matmul_on(V::ISA, q, k, x, rows, y)
        })
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
    let tile = |r: usize, nr: usize, t: usize, nt: usize| {
        // SAFETY: the tile's rows and tokens lie inside w, x and y (checked shapes), and the
        // CPU has `V`'s features.
        unsafe {
            let y = y.as_mut_ptr().add(t * n_out + (r - first));
            let x = x.as_ptr().add(t * k);
            on_width!(
                V,
                matmul::tiles(nr, nt, w.as_ptr().add(r * k), x, y, k, n_out)
            )
        }
    };
    let weight_bytes = core::mem::size_of::<L>();
    let (r_tile, t_tile) = V::shape::<L>();
    super::for_each_tile_rows_inner(rows, n_tokens, k, weight_bytes, r_tile, t_tile, tile);
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
    unsafe {
        V::tile::<L>(
            nr,
            nt,
            TileArgs {
                w,
                x,
                y,
                k,
                y_stride,
            },
        )
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
            wv[i] = if n == 16 {
                V::sum_widen(p)
            } else {
                V::sum_widen_part(p, n)
            };
        }
        for t in 0..T {
            let p = a.x.add(t * a.k + kk);
            let xv = if n == 16 {
                V::sum_widen(p)
            } else {
                V::sum_widen_part(p, n)
            };
            for i in 0..R {
                acc[i][t] = V::sum_fma(wv[i], xv, acc[i][t]);
            }
        }
    }
}

/// The AVX2 tile (see the module docs): the `k` loop once per 8-lane half of the canonical
/// 16 lanes, one register per output. The canonical reduction splits at the halves,
/// `(q0 + q1) + (q2 + q3)`, so the low half is reduced to `q0 + q1` and stored before the
/// high pass starts (nothing stays live across the passes), and the high pass adds
/// `q2 + q3` to it: bit for bit the canonical sum.
///
/// # Safety
/// As [`tile`]; `V` is `__m256`.
#[allow(clippy::needless_range_loop)]
#[inline(always)]
unsafe fn tile_halves<V: Vector, L: Lanes, const R: usize, const T: usize>(a: TileArgs<L>) {
    debug_assert_eq!(V::N, 8);
    // SAFETY: forwarded from the caller; output (t, i) is inside the tile it vouched for.
    unsafe {
        let low = half_sums::<V, L, R, T>(&a, 0);
        for i in 0..R {
            for t in 0..T {
                *a.y.add(t * a.y_stride + i) = reduce_half(low[i][t]);
            }
        }
        let high = half_sums::<V, L, R, T>(&a, 8);
        for i in 0..R {
            for t in 0..T {
                *a.y.add(t * a.y_stride + i) += reduce_half(high[i][t]);
            }
        }
    }
}

/// Half of the canonical 16-lane reduction over 8 lanes `x`:
/// `((x0 + x2) + (x1 + x3)) + ((x4 + x6) + (x5 + x7))`.
///
/// # Safety
/// AVX; `V` is `__m256`.
#[inline(always)]
unsafe fn reduce_half<V: Vector>(x: V) -> f32 {
    use std::arch::x86_64::*;
    debug_assert_eq!(core::mem::size_of::<V>(), 32);
    // SAFETY: V is __m256 (same size, checked above), the caller runs with AVX.
    unsafe {
        let x: __m256 = core::mem::transmute_copy(&x);
        // Lanes j and j ^ 2 of each 128-bit half: x0 + x2, x1 + x3 (x4 + x6, x5 + x7).
        let pairs = _mm256_add_ps(x, _mm256_permute_ps::<0b01_00_11_10>(x));
        // Then lanes j and j ^ 1: (x0 + x2) + (x1 + x3) in lane 0, likewise lane 4.
        let quads = _mm256_add_ps(pairs, _mm256_permute_ps::<0b10_11_00_01>(pairs));
        _mm_cvtss_f32(_mm256_castps256_ps128(quads))
            + _mm_cvtss_f32(_mm256_extractf128_ps::<1>(quads))
    }
}

/// One 8-lane half of every canonical sum of the tile: lanes `half..half + 8` of each
/// 16-element block, zero-filled tail.
///
/// # Safety
/// As [`tile`]; `half` is 0 or 8.
#[allow(clippy::needless_range_loop)]
#[inline(always)]
unsafe fn half_sums<V: Vector, L: Lanes, const R: usize, const T: usize>(
    a: &TileArgs<L>,
    half: usize,
) -> [[V; T]; R] {
    let k = a.k;
    let k16 = k / 16 * 16;
    // SAFETY: whole blocks read kk + 8 <= k16 <= k; the partial one reads only below k, in
    // every row / token.
    unsafe {
        let mut acc = [[V::zero(); T]; R];
        let (mut w, mut x) = (a.w.add(half), a.x.add(half));
        let blocks = k16 / 16;
        for _ in 0..blocks {
            let mut wv = [V::zero(); R];
            for i in 0..R {
                wv[i] = V::widen(w.add(i * k));
            }
            for t in 0..T {
                let xv = V::load(x.add(t * k));
                for i in 0..R {
                    acc[i][t] = V::fma(wv[i], xv, acc[i][t]);
                }
            }
            w = w.add(16);
            x = x.add(16);
        }
        add_partial_block(&mut acc, a.w, a.x, k, half);
        acc
    }
}

/// Adds to the tile's half sums `acc` (rows `w + i · k`, tokens `x + t · k`) this half's share
/// of the partial block past the whole 16-element blocks: elements `k16 + half + 0..n`.
///
/// # Safety
/// `V`'s features; rows and tokens readable for `k` elements; `half` is 0 or 8.
#[allow(clippy::needless_range_loop)]
#[inline(always)]
pub(super) unsafe fn add_partial_block<V: Vector, L: Lanes, const R: usize, const T: usize>(
    acc: &mut [[V; T]; R],
    w: *const L,
    x: *const f32,
    k: usize,
    half: usize,
) {
    let start = k / 16 * 16 + half;
    let n = k.saturating_sub(start).min(8);
    // SAFETY: elements start..start + n lie below k in every row / token (caller's bounds).
    unsafe {
        if n > 0 {
            let (w, x) = (w.add(start), x.add(start));
            for i in 0..R {
                let wv = V::widen_part(w.add(i * k), n);
                for t in 0..T {
                    let xv = V::widen_part(x.add(t * k), n);
                    acc[i][t] = V::fma(wv, xv, acc[i][t]);
                }
            }
        }
    }
}
