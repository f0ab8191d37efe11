//! AVX2 / AVX-512 Q8_0 × 16-bit dot products: per block, the 32 weight codes widened to two
//! registers of i16 (`vpmovsxbw`), then `pmaddwd` with the activation codes of each half and
//! one add give the eight canonical partial sums exactly; even blocks accumulate in one ymm,
//! odd blocks in the other — the canonical 16 lanes as `(__m256, __m256)`. A weight block is
//! widened once for [`TOKENS`] tokens (prefill); decode (one token) has its own row loop,
//! `one_token`, with the block scales prepared per row and, where
//! [`crate::prefetch::weight_hints`] says so, a software prefetch.
//!
//! AVX-512 has its own kernels, two blocks per zmm (`super::zmm`).

use super::{Tile, PARTIALS};
use crate::prefetch::WEIGHT_AHEAD;
use crate::simd::x86::Vector;
use crate::weight::Q8_BLOCK;
use crate::Isa;
use std::arch::x86_64::*;

crate::isa::x86_kernels! {
    fn dot_tile(tile: Tile<'_>, y: &mut [f32]);
}

/// Tokens sharing each weight block load (4 × 2 accumulators + operands fit 16 ymm).
const TOKENS: usize = 4;

/// # Safety
/// AVX2 (+FMA, F16C) available; `tile` checked against `y` (`super::Tile::check`).
#[inline(always)]
unsafe fn dot_tile<V: Vector>(tile: Tile<'_>, y: &mut [f32]) {
    const _: () = assert!(PARTIALS == 8);
    if V::ISA == Isa::Avx512 {
        // SAFETY: this body runs with AVX-512 F/BW/VL (its entry point); as the caller
        // guarantees otherwise.
        return unsafe { super::zmm::dot_tile(tile, y) };
    }
    if tile.tokens.len() == 1 {
        // SAFETY: as the caller guarantees.
        return unsafe { one_token(&tile, y) };
    }
    let (k, blocks) = (tile.k, tile.k / Q8_BLOCK);
    let mut w_scales = vec![0.0f32; blocks];
    for r in tile.rows.clone() {
        // SAFETY: row r's `blocks` scales and k codes lie inside w, every token's codes and
        // scales inside x, and every output inside y (Tile::check); AVX2 (caller).
        unsafe {
            widen_scales(tile.w.scales.as_ptr().add(r * blocks), &mut w_scales);
            let row = Row {
                codes: tile.w.codes.as_ptr().add(r * k),
                scales: &w_scales,
                k,
            };
            let out = y.as_mut_ptr().add(r - tile.rows.start);
            let mut t = tile.tokens.start;
            while t + TOKENS <= tile.tokens.end {
                tokens::<TOKENS>(&row, tile.x, t, out.add(t * tile.y_stride), tile.y_stride);
                t += TOKENS;
            }
            for t in t..tile.tokens.end {
                tokens::<1>(&row, tile.x, t, out.add(t * tile.y_stride), tile.y_stride);
            }
        }
    }
}

/// Block scales a decode row prepares at a time (on the stack): rows of up to 16,384 weights
/// in one piece, longer ones in pieces of this many blocks (even, so block parity and with it
/// the even/odd accumulators carry across pieces).
const SCALE_CHUNK: usize = 512;

/// Decode (one token): every row of the tile streamed once, start to end, with a software
/// prefetch [`WEIGHT_AHEAD`] bytes ahead (one per 64-byte pair of blocks) where
/// [`crate::prefetch::weight_hints`] asks for it. Per row the block scales are widened and
/// multiplied by the token's 8 at a time into the canonical `s_b`, so the block loop is two
/// widening loads, two `pmaddwd`, one convert and one FMA with a broadcast load — no scalar
/// multiply or register broadcast per block.
///
/// # Safety
/// AVX2 (+FMA, F16C) available; `tile` (one token) checked against `y`.
#[inline(always)]
unsafe fn one_token(tile: &Tile<'_>, y: &mut [f32]) {
    const _: () = assert!(SCALE_CHUNK.is_multiple_of(2));
    let (k, blocks) = (tile.k, tile.k / Q8_BLOCK);
    let (x_codes, x_scales) = tile.x.token(tile.tokens.start, k);
    let hints = crate::prefetch::weight_hints();
    let mut scales = [0.0f32; SCALE_CHUNK];
    let out = &mut y[tile.tokens.start * tile.y_stride..][..tile.rows.len()];
    for (o, r) in out.iter_mut().zip(tile.rows.clone()) {
        let (mut even, mut odd) = (_mm256_setzero_ps(), _mm256_setzero_ps());
        let mut first = 0;
        while first < blocks {
            let n = SCALE_CHUNK.min(blocks - first);
            // SAFETY: blocks first..first + n of row r (scales and codes) lie inside w, of the
            // token inside x (Tile::check); AVX2+FMA+F16C (caller).
            unsafe {
                let w_scales = tile.w.scales.as_ptr().add(r * blocks + first);
                block_scales(w_scales, &x_scales[first..first + n], &mut scales[..n]);
                let codes = tile.w.codes.as_ptr().add(r * k + first * Q8_BLOCK);
                let x = x_codes.as_ptr().add(first * Q8_BLOCK);
                let mut b = 0;
                while b + 2 <= n {
                    if hints {
                        // A hint: never faults, even past the end of the weights.
                        let ahead = codes.wrapping_add(b * Q8_BLOCK + WEIGHT_AHEAD);
                        _mm_prefetch::<_MM_HINT_T0>(ahead);
                    }
                    even = one_block(codes, x, scales.as_ptr(), b, even);
                    odd = one_block(codes, x, scales.as_ptr(), b + 1, odd);
                    b += 2;
                }
                if b < n {
                    even = one_block(codes, x, scales.as_ptr(), b, even);
                }
            }
            first += n;
        }
        *o = <__m256 as Vector>::reduce((even, odd));
    }
}

/// `acc + s_b · p_b` for block `b`: the eight canonical partial sums of weight codes `w` and
/// activation codes `x`, scaled by `scales[b]`.
///
/// # Safety
/// AVX2+FMA; block `b` inside `w`, `x` and `scales`.
#[inline(always)]
unsafe fn one_block(
    w: *const i8,
    x: *const i16,
    scales: *const f32,
    b: usize,
    acc: __m256,
) -> __m256 {
    // SAFETY: as the caller guarantees.
    unsafe {
        let (w, x) = (w.add(b * Q8_BLOCK), x.add(b * Q8_BLOCK));
        let w_low = _mm256_cvtepi8_epi16(_mm_loadu_si128(w as *const __m128i));
        let w_high = _mm256_cvtepi8_epi16(_mm_loadu_si128(w.add(16) as *const __m128i));
        let low = _mm256_madd_epi16(w_low, _mm256_loadu_si256(x as *const __m256i));
        let high = _mm256_madd_epi16(w_high, _mm256_loadu_si256(x.add(16) as *const __m256i));
        let partials = _mm256_cvtepi32_ps(_mm256_add_epi32(low, high));
        _mm256_fmadd_ps(_mm256_broadcast_ss(&*scales.add(b)), partials, acc)
    }
}

/// `out[b] = f32(w_scales[b]) · x_scales[b]` (the canonical block scale `s_b`; both steps
/// exact widening then one rounding, as the scalar reference does), 8 at a time.
///
/// # Safety
/// AVX2+F16C; `w_scales` readable for `out.len()` values, `x_scales` at least that long.
#[inline(always)]
unsafe fn block_scales(w_scales: *const half::f16, x_scales: &[f32], out: &mut [f32]) {
    let mut b = 0;
    // SAFETY: groups of 8 lie inside all three (b + 8 <= out.len() <= x_scales.len()); F16C
    // (caller).
    unsafe {
        while b + 8 <= out.len() {
            let wide = _mm256_cvtph_ps(_mm_loadu_si128(w_scales.add(b) as *const __m128i));
            let x = _mm256_loadu_ps(x_scales.as_ptr().add(b));
            _mm256_storeu_ps(out.as_mut_ptr().add(b), _mm256_mul_ps(wide, x));
            b += 8;
        }
        for (b, o) in out.iter_mut().enumerate().skip(b) {
            *o = (*w_scales.add(b)).to_f32() * x_scales[b];
        }
    }
}

/// One weight row: its codes and its block scales widened to f32.
struct Row<'a> {
    codes: *const i8,
    scales: &'a [f32],
    k: usize,
}

/// The f16 block scales of a row, widened (exactly) 8 at a time.
///
/// # Safety
/// AVX2+F16C; `scales` readable for `out.len()` values.
#[inline(always)]
unsafe fn widen_scales(scales: *const half::f16, out: &mut [f32]) {
    let mut b = 0;
    // SAFETY: groups of 8 lie inside both (b + 8 <= out.len()); F16C (caller).
    unsafe {
        while b + 8 <= out.len() {
            let wide = _mm256_cvtph_ps(_mm_loadu_si128(scales.add(b) as *const __m128i));
            _mm256_storeu_ps(out.as_mut_ptr().add(b), wide);
            b += 8;
        }
        for (b, o) in out.iter_mut().enumerate().skip(b) {
            *o = (*scales.add(b)).to_f32();
        }
    }
}

/// Dot products of `row` with tokens `t..t + N`, stored at `out + j·y_stride`.
///
/// # Safety
/// AVX2+FMA; tokens `t..t + N` inside `x`, `out` writable at those offsets.
#[inline(always)]
unsafe fn tokens<const N: usize>(
    row: &Row<'_>,
    x: &super::Q8Activations,
    t: usize,
    out: *mut f32,
    y_stride: usize,
) {
    let blocks = row.k / Q8_BLOCK;
    // SAFETY: as the caller guarantees.
    unsafe {
        let x_codes = x.codes.as_ptr().add(t * row.k);
        let x_scales = x.scales.as_ptr().add(t * blocks);
        let (mut even, mut odd) = ([_mm256_setzero_ps(); N], [_mm256_setzero_ps(); N]);
        let mut b = 0;
        while b + 2 <= blocks {
            block::<N>(row, x_codes, x_scales, b, &mut even);
            block::<N>(row, x_codes, x_scales, b + 1, &mut odd);
            b += 2;
        }
        if b < blocks {
            block::<N>(row, x_codes, x_scales, b, &mut even);
        }
        for j in 0..N {
            *out.add(j * y_stride) = <__m256 as Vector>::reduce((even[j], odd[j]));
        }
    }
}

/// Block `b` of `row` against the same block of `N` tokens, into their accumulators.
///
/// # Safety
/// AVX2+FMA; block `b` inside the row and each token.
#[inline(always)]
unsafe fn block<const N: usize>(
    row: &Row<'_>,
    x_codes: *const i16,
    x_scales: *const f32,
    b: usize,
    acc: &mut [__m256; N],
) {
    let blocks = row.k / Q8_BLOCK;
    // SAFETY: as the caller guarantees.
    unsafe {
        let w = row.codes.add(b * Q8_BLOCK);
        let w_low = _mm256_cvtepi8_epi16(_mm_loadu_si128(w as *const __m128i));
        let w_high = _mm256_cvtepi8_epi16(_mm_loadu_si128(w.add(16) as *const __m128i));
        for (j, acc) in acc.iter_mut().enumerate() {
            let at = x_codes.add(j * row.k + b * Q8_BLOCK);
            let low = _mm256_madd_epi16(w_low, _mm256_loadu_si256(at as *const __m256i));
            let high = _mm256_madd_epi16(w_high, _mm256_loadu_si256(at.add(16) as *const __m256i));
            let partials = _mm256_cvtepi32_ps(_mm256_add_epi32(low, high));
            let scale = _mm256_set1_ps(row.scales[b] * *x_scales.add(j * blocks + b));
            *acc = _mm256_fmadd_ps(scale, partials, *acc);
        }
    }
}
