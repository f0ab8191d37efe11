//! AVX2 / AVX-512 Q8_0 × 16-bit dot products: per block, the 32 weight codes widened to two
//! registers of i16 (`vpmovsxbw`), then `pmaddwd` with the activation codes of each half and
//! one add give the eight canonical partial sums exactly; even blocks accumulate in one ymm,
//! odd blocks in the other — the canonical 16 lanes as `(__m256, __m256)`. A weight block is
//! widened once for [`TOKENS`] tokens (prefill); decode has one.
//!
//! AVX-512 runs the same 256-bit body: the integer steps are what this needs.

use super::{Tile, PARTIALS};
use crate::simd::x86::Vector;
use crate::weight::Q8_BLOCK;
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
