//! The AVX2 prefill matmul's tile on f16 weights: 4 rows × 3 tokens, its loop in assembly and
//! its sums reduced four at a time.
//!
//! Like the intrinsics tile in `x86.rs`, it runs the `k` loop once per 8-lane half of the
//! canonical 16 lanes: 12 accumulators, the 3 tokens' activation vectors and one widened
//! weight vector fill the 16 ymm registers. Written with intrinsics, LLVM spilled two of the
//! accumulators to the stack inside the loop (~39 GFLOP/s a thread on an AMD EPYC Zen 3,
//! against ~77 for the 3 × 3 tile), so the loop is written out here. At the end of each pass
//! the 4 rows' sums of a token are reduced together — shuffles across the four accumulators
//! instead of a permute chain and two scalar extractions per sum — and stored as one vector:
//! the rows of a token are adjacent in the output.
//!
//! Every lane sees the FMAs and every sum the additions of the scalar reference, in its order
//! (`crate::canon`): the outputs are bit for bit the intrinsics tile's.

use half::f16;
use std::arch::asm;
use std::arch::x86_64::*;

/// Rows of the tile.
pub(super) const ROWS: usize = 4;
/// Tokens of the tile.
pub(super) const TOKENS: usize = 3;

/// The tile at `w` (4 rows, `k` apart), `x` (3 tokens, `k` apart) into `y` (token `t`'s 4
/// rows at `y + t · y_stride`).
///
/// # Safety
/// AVX2, FMA and F16C present; rows and tokens readable for `k` elements, the outputs
/// writable.
#[inline]
#[target_feature(enable = "avx,avx2,fma,f16c")]
pub(super) unsafe fn tile(w: *const f16, x: *const f32, y: *mut f32, k: usize, y_stride: usize) {
    // SAFETY: forwarded from the caller; every output written lies in the tile.
    unsafe {
        let low = half_sums(w, x, k, 0);
        for (t, sums) in low.iter().enumerate() {
            _mm_storeu_ps(y.add(t * y_stride), *sums);
        }
        let high = half_sums(w, x, k, 8);
        for (t, sums) in high.iter().enumerate() {
            let at = y.add(t * y_stride);
            _mm_storeu_ps(at, _mm_add_ps(_mm_loadu_ps(at), *sums));
        }
    }
}

/// Lanes `half..half + 8` of every 16-element block (zero-filled tail) summed over `k`, each
/// of the 12 sums reduced as `crate::canon` reduces a half: per token, its 4 rows' sums.
///
/// # Safety
/// As [`tile`]; `half` is 0 or 8.
#[inline]
#[target_feature(enable = "avx,avx2,fma,f16c")]
unsafe fn half_sums(w: *const f16, x: *const f32, k: usize, half: usize) -> [__m128; TOKENS] {
    // SAFETY: whole blocks read below k / 16 * 16; the partial one only below k (caller's
    // bounds).
    unsafe {
        let mut acc = whole_blocks(w.add(half), x.add(half), k, k / 16);
        super::x86::add_partial_block(&mut acc, w, x, k, half);
        std::array::from_fn(|t| reduce_half_x4(acc[0][t], acc[1][t], acc[2][t], acc[3][t]))
    }
}

/// `crate::canon`'s half reduction, `((v0 + v2) + (v1 + v3)) + ((v4 + v6) + (v5 + v7))`, of
/// four vectors at once: lane `j` of the result is vector `j`'s.
///
/// # Safety
/// AVX present.
#[inline]
#[target_feature(enable = "avx")]
unsafe fn reduce_half_x4(a: __m256, b: __m256, c: __m256, d: __m256) -> __m128 {
    // [a0 a1 b0 b1 | a4 a5 b4 b5] + [a2 a3 b2 b3 | a6 a7 b6 b7]: the pairs v0 + v2, v1 + v3
    // (v4 + v6, v5 + v7) of a and b.
    let ab = _mm256_add_ps(
        _mm256_shuffle_ps::<0b01_00_01_00>(a, b),
        _mm256_shuffle_ps::<0b11_10_11_10>(a, b),
    );
    let cd = _mm256_add_ps(
        _mm256_shuffle_ps::<0b01_00_01_00>(c, d),
        _mm256_shuffle_ps::<0b11_10_11_10>(c, d),
    );
    // The pairs' sums, (v0 + v2) + (v1 + v3) in the low half and (v4 + v6) + (v5 + v7) in the
    // high one, for a, b, c, d in turn.
    let quads = _mm256_add_ps(
        _mm256_shuffle_ps::<0b10_00_10_00>(ab, cd),
        _mm256_shuffle_ps::<0b11_01_11_01>(ab, cd),
    );
    _mm_add_ps(
        _mm256_castps256_ps128(quads),
        _mm256_extractf128_ps::<1>(quads),
    )
}

/// The sums over `blocks` 16-element blocks of lanes 0–7 of each block (the caller offsets
/// `w` and `x` by the half): `acc[i][t] = Σ w_i · x_t`, FMA by FMA from zero, for rows
/// `w + i · k` (f16) and tokens `x + t · k` (f32).
///
/// # Safety
/// AVX2, FMA and F16C present; rows `w + i · k` (`i < 4`) readable for `16 · blocks - 8`
/// halves and tokens `x + t · k` (`t < 3`) for as many floats.
#[inline]
#[target_feature(enable = "avx,avx2,fma,f16c")]
unsafe fn whole_blocks(
    w: *const f16,
    x: *const f32,
    k: usize,
    blocks: usize,
) -> [[__m256; TOKENS]; ROWS] {
    let (a00, a01, a02, a10, a11, a12): (__m256, __m256, __m256, __m256, __m256, __m256);
    let (a20, a21, a22, a30, a31, a32): (__m256, __m256, __m256, __m256, __m256, __m256);
    // SAFETY: the caller vouches for the features and for every address read: row i at
    // `w + 2·k·i` bytes, token t at `x + 4·k·t` bytes, 32 (f16) / 64 (f32) bytes further a
    // block, 16 / 32 bytes read of each. No memory is written; the stack is not touched.
    unsafe {
        asm!(
            "vxorps {a00}, {a00}, {a00}",
            "vxorps {a01}, {a01}, {a01}",
            "vxorps {a02}, {a02}, {a02}",
            "vxorps {a10}, {a10}, {a10}",
            "vxorps {a11}, {a11}, {a11}",
            "vxorps {a12}, {a12}, {a12}",
            "vxorps {a20}, {a20}, {a20}",
            "vxorps {a21}, {a21}, {a21}",
            "vxorps {a22}, {a22}, {a22}",
            "vxorps {a30}, {a30}, {a30}",
            "vxorps {a31}, {a31}, {a31}",
            "vxorps {a32}, {a32}, {a32}",
            "test {n}, {n}",
            "jz 3f",
            "2:",
            "vmovups {x0}, ymmword ptr [{x}]",
            "vmovups {x1}, ymmword ptr [{x} + {xs}]",
            "vmovups {x2}, ymmword ptr [{x} + {xs}*2]",
            "vcvtph2ps {wv}, xmmword ptr [{w}]",
            "vfmadd231ps {a00}, {wv}, {x0}",
            "vfmadd231ps {a01}, {wv}, {x1}",
            "vfmadd231ps {a02}, {wv}, {x2}",
            "vcvtph2ps {wv}, xmmword ptr [{w} + {ws}]",
            "vfmadd231ps {a10}, {wv}, {x0}",
            "vfmadd231ps {a11}, {wv}, {x1}",
            "vfmadd231ps {a12}, {wv}, {x2}",
            "vcvtph2ps {wv}, xmmword ptr [{w} + {ws}*2]",
            "vfmadd231ps {a20}, {wv}, {x0}",
            "vfmadd231ps {a21}, {wv}, {x1}",
            "vfmadd231ps {a22}, {wv}, {x2}",
            "vcvtph2ps {wv}, xmmword ptr [{w} + {ws3}]",
            "vfmadd231ps {a30}, {wv}, {x0}",
            "vfmadd231ps {a31}, {wv}, {x1}",
            "vfmadd231ps {a32}, {wv}, {x2}",
            "add {x}, 64",
            "add {w}, 32",
            "dec {n}",
            "jnz 2b",
            "3:",
            a00 = out(ymm_reg) a00,
            a01 = out(ymm_reg) a01,
            a02 = out(ymm_reg) a02,
            a10 = out(ymm_reg) a10,
            a11 = out(ymm_reg) a11,
            a12 = out(ymm_reg) a12,
            a20 = out(ymm_reg) a20,
            a21 = out(ymm_reg) a21,
            a22 = out(ymm_reg) a22,
            a30 = out(ymm_reg) a30,
            a31 = out(ymm_reg) a31,
            a32 = out(ymm_reg) a32,
            x0 = out(ymm_reg) _,
            x1 = out(ymm_reg) _,
            x2 = out(ymm_reg) _,
            wv = out(ymm_reg) _,
            x = inout(reg) x => _,
            w = inout(reg) w => _,
            n = inout(reg) blocks => _,
            xs = in(reg) 4 * k,
            ws = in(reg) 2 * k,
            ws3 = in(reg) 6 * k,
            options(pure, readonly, nostack),
        );
    }
    [
        [a00, a01, a02],
        [a10, a11, a12],
        [a20, a21, a22],
        [a30, a31, a32],
    ]
}
