//! AVX-512 Q8_0 × 16-bit dot products: two blocks per 512-bit step, their 16 canonical
//! partial sums landing in the 16 lanes of one zmm, in canonical order (lanes 0..8 block `b`,
//! lanes 8..16 block `b + 1`), so one convert and one FMA per pair of blocks.
//!
//! The pairing: lane `l < 8` needs elements `2l, 2l+1` and `16+2l, 17+2l` of block `b`, lane
//! `8 + l` the same of block `b + 1`. Of a pair's 64 weight bytes `[b.lo, b.hi, b1.lo, b1.hi]`
//! (16 each), `b.hi, b1.lo` is one contiguous 32-byte window (`u`) and `b.lo, b1.hi` the rest
//! (`v`, one 128-bit insert); widened to i16 (`vpmovsxbw`), `pmaddwd(u, x_u) + pmaddwd(v, x_v)`
//! is exactly the canonical `p_b | p_b1`. `vpdpwssd` (AVX512_VNNI, detected at run time) does
//! the second multiply and the add in one instruction with the same exact int32 result.
//! The activations come quantized in that order (`x_u, x_v` contiguous per pair:
//! [`CodeOrder::Paired`]).

use super::{CodeOrder, Tile};
use crate::simd::avx512::reduce16;
use crate::weight::Q8_BLOCK;
use std::arch::x86_64::*;

/// How the two `pmaddwd` products of a pair are added: with `vpdpwssd` or without.
pub(crate) trait PairSums {
    /// `pmaddwd(u, xu) + pmaddwd(v, xv)` per int32 lane (exact: |sum| < 2^24).
    ///
    /// # Safety
    /// AVX-512 BW (and VNNI for the VNNI variant).
    unsafe fn sums(u: __m512i, xu: __m512i, v: __m512i, xv: __m512i) -> __m512i;
}

/// `vpdpwssd` (AVX512_VNNI): the second product accumulated into the first.
pub(crate) struct Vnni;
/// `vpmaddwd` twice and `vpaddd`: AVX-512 CPUs without VNNI (Skylake-X).
pub(crate) struct Madd;

impl PairSums for Vnni {
    #[inline(always)]
    unsafe fn sums(u: __m512i, xu: __m512i, v: __m512i, xv: __m512i) -> __m512i {
        // SAFETY: the caller runs with AVX-512 BW + VNNI.
        unsafe { _mm512_dpwssd_epi32(_mm512_madd_epi16(u, xu), v, xv) }
    }
}

impl PairSums for Madd {
    #[inline(always)]
    unsafe fn sums(u: __m512i, xu: __m512i, v: __m512i, xv: __m512i) -> __m512i {
        // SAFETY: the caller runs with AVX-512 BW.
        unsafe { _mm512_add_epi32(_mm512_madd_epi16(u, xu), _mm512_madd_epi16(v, xv)) }
    }
}

/// Which [`PairSums`] the AVX-512 entry point uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Variant {
    Vnni,
    Madd,
}

impl Variant {
    /// The fastest variant this CPU runs (the caller has checked AVX-512 F/BW/VL).
    pub(crate) fn detected() -> Variant {
        if std::arch::is_x86_feature_detected!("avx512vnni") {
            Variant::Vnni
        } else {
            Variant::Madd
        }
    }
}

/// The AVX-512 tile kernel, VNNI when the CPU has it (`super::zmm_variant`).
///
/// # Safety
/// AVX-512 F/BW/VL (+AVX2/FMA/F16C) available; `tile` checked against `y`.
pub(crate) unsafe fn dot_tile(tile: Tile<'_>, y: &mut [f32]) {
    // SAFETY: as the caller guarantees.
    unsafe { dot_tile_with(super::zmm_variant(), tile, y) }
}

/// # Safety
/// As [`dot_tile`]; VNNI available if `variant` is [`Variant::Vnni`].
unsafe fn dot_tile_with(variant: Variant, tile: Tile<'_>, y: &mut [f32]) {
    // SAFETY: the features each entry point enables are the caller's to vouch for.
    unsafe {
        match variant {
            Variant::Vnni => dot_tile_vnni(tile, y),
            Variant::Madd => dot_tile_madd(tile, y),
        }
    }
}

/// # Safety
/// AVX-512 F/BW/VL/VNNI (+AVX2/FMA/F16C); `tile` checked against `y`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn dot_tile_vnni(tile: Tile<'_>, y: &mut [f32]) {
    // SAFETY: this entry point enables the features the body is written for.
    unsafe { tile_body::<Vnni>(tile, y) }
}

/// # Safety
/// AVX-512 F/BW/VL (+AVX2/FMA/F16C); `tile` checked against `y`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
unsafe fn dot_tile_madd(tile: Tile<'_>, y: &mut [f32]) {
    // SAFETY: this entry point enables the features the body is written for.
    unsafe { tile_body::<Madd>(tile, y) }
}

/// Tokens sharing each pair of widened weight blocks in prefill (8 accumulators + operands
/// fit well inside 32 zmm).
const TOKENS: usize = 8;

/// # Safety
/// AVX-512 F/BW/VL (+AVX2/FMA/F16C, and VNNI for [`Vnni`]); `tile` checked against `y`.
#[inline(always)]
unsafe fn tile_body<S: PairSums>(tile: Tile<'_>, y: &mut [f32]) {
    let (k, blocks) = (tile.k, tile.k / Q8_BLOCK);
    assert_eq!(
        tile.x.order,
        CodeOrder::Paired,
        "zmm q8: codes not in pair order"
    );
    let x = &tile.x.codes[tile.tokens.start * k..tile.tokens.end * k];
    let x_scales = &tile.x.scales[tile.tokens.start * blocks..tile.tokens.end * blocks];
    if tile.tokens.len() == 1 {
        // SAFETY: as the caller guarantees; `x` holds the token's k codes.
        return unsafe { one_token::<S>(&tile, x, x_scales, y) };
    }
    // Every row's scales widened, plus one spare per row so a pair's 64-bit load stays inside.
    let stride = blocks + 1;
    let mut w_scales = vec![0.0f32; tile.rows.len() * stride];
    for (r, wide) in tile.rows.clone().zip(w_scales.chunks_exact_mut(stride)) {
        for (wide, s) in wide
            .iter_mut()
            .zip(&tile.w.scales[r * blocks..(r + 1) * blocks])
        {
            *wide = s.to_f32();
        }
    }
    // Token groups outside, rows inside: a group's codes (TOKENS · k · 2 bytes) stay in L1
    // while the rows stream past from L2. Rows outside read every token's codes from L2 for
    // each row, two bytes per multiply-add: a Q8_0 prefill ran 1.12–1.18× slower that way
    // (in-process A/B, AMD EPYC Zen 4).
    let n_tokens = tile.tokens.len();
    let mut j = 0;
    while j < n_tokens {
        let group = match n_tokens - j {
            left if left >= TOKENS => TOKENS,
            left if left >= 2 => 2,
            _ => 1,
        };
        for (i, r) in tile.rows.clone().enumerate() {
            // SAFETY: row r's k codes lie inside w, every token's codes (in pair order) and
            // scales inside `x` / `x_scales`, every output inside y (Tile::check); AVX-512
            // (caller).
            unsafe {
                let row = Row {
                    codes: tile.w.codes.as_ptr().add(r * k),
                    scales: w_scales.as_ptr().add(i * stride),
                    k,
                };
                let xc = x.as_ptr().add(j * k);
                let xs = x_scales.as_ptr().add(j * blocks);
                let o = y
                    .as_mut_ptr()
                    .add(i + (tile.tokens.start + j) * tile.y_stride);
                match group {
                    TOKENS => tokens::<S, TOKENS>(&row, xc, xs, o, tile.y_stride),
                    2 => tokens::<S, 2>(&row, xc, xs, o, tile.y_stride),
                    _ => tokens::<S, 1>(&row, xc, xs, o, tile.y_stride),
                }
            }
        }
        j += group;
    }
}

/// Row streams a decode step walks together: four independent FMA chains (one row's is too
/// short to hide the FMA latency and the final reduction) sharing each activation load. The
/// streams are a quarter of the range apart, each sequential in memory: four rows side by
/// side (interleaved within a few KiB) decoded slower from DRAM than one row at a time.
const STREAMS: usize = 4;

/// Decode (one token): the rows as [`STREAMS`] sequential streams (the range's quarters, then
/// the left-over rows one by one), with no software prefetch: every CPU that runs this kernel
/// has AVX-512, where the hints made decode slower ([`crate::prefetch::weight_hints`]).
///
/// # Safety
/// AVX-512 F/BW/VL (+AVX2/FMA/F16C, and VNNI for [`Vnni`]); `tile` (one token) checked
/// against `y`; `x` the token's k codes in [`CodeOrder::Paired`], `x_scales` its block scales.
#[inline(always)]
unsafe fn one_token<S: PairSums>(tile: &Tile<'_>, x: &[i16], x_scales: &[f32], y: &mut [f32]) {
    let (k, blocks) = (tile.k, tile.k / Q8_BLOCK);
    assert!(x.len() >= k && x_scales.len() >= blocks);
    let out = &mut y[tile.tokens.start * tile.y_stride..][..tile.rows.len()];
    let quarter = tile.rows.len() / STREAMS;
    // SAFETY: every row r visited lies in tile.rows, so its codes and scales lie inside w
    // (Tile::check) and its output r - rows.start inside `out`; the token's codes and scales
    // as asserted; AVX-512 (caller).
    unsafe {
        let out = out.as_mut_ptr();
        let rows_at = |r: usize| Rows {
            codes: tile.w.codes.as_ptr().add(r * k),
            scales: tile.w.scales.as_ptr().add(r * blocks),
            out: out.add(r - tile.rows.start),
            k,
            step: quarter,
        };
        let (x, x_scales) = (x.as_ptr(), x_scales.as_ptr());
        for r in tile.rows.start..tile.rows.start + quarter {
            rows_dot::<S, STREAMS>(rows_at(r), x, x_scales);
        }
        for r in tile.rows.start + STREAMS * quarter..tile.rows.end {
            rows_dot::<S, 1>(rows_at(r), x, x_scales);
        }
    }
}

/// `R` weight rows `step` rows apart (the first at `codes` / `scales`) and their outputs
/// (`step` apart from `out`).
struct Rows {
    codes: *const i8,
    scales: *const half::f16,
    out: *mut f32,
    k: usize,
    step: usize,
}

/// `out[i·step] = row i · x` for the `R` rows of `rows` and one token (codes `x` in
/// [`CodeOrder::Paired`], block scales `x_scales`). Each pair's canonical scales `s_b, s_b1` are
/// made on the way (widen, multiply, spread over the lanes).
///
/// # Safety
/// AVX-512 F/BW/VL (+AVX2/FMA/F16C, VNNI for [`Vnni`]); the `R` rows and the token inside
/// their buffers, the `R` outputs writable.
#[inline(always)]
unsafe fn rows_dot<S: PairSums, const R: usize>(rows: Rows, x: *const i16, x_scales: *const f32) {
    let (k, blocks) = (rows.k, rows.k / Q8_BLOCK);
    // SAFETY: as the caller guarantees; blocks b, b + 1 lie inside every row and the token.
    unsafe {
        let codes = |i: usize, b: usize| rows.codes.add(i * rows.step * k + b * Q8_BLOCK);
        let scales = |i: usize, b: usize| rows.scales.add(i * rows.step * blocks + b);
        let mut acc = [_mm512_setzero_ps(); R];
        let mut b = 0;
        while b + 2 <= blocks {
            let xu = _mm512_loadu_si512(x.add(b * Q8_BLOCK) as *const __m512i);
            let xv = _mm512_loadu_si512(x.add(b * Q8_BLOCK + 32) as *const __m512i);
            let x_scale = _mm_castpd_ps(_mm_load_sd(x_scales.add(b) as *const f64));
            for (i, acc) in acc.iter_mut().enumerate() {
                let w = codes(i, b);
                let (u, v) = widen_pair(w);
                let partials = _mm512_cvtepi32_ps(S::sums(u, xu, v, xv));
                let two = (scales(i, b) as *const i32).read_unaligned();
                let w_scale = _mm_cvtph_ps(_mm_cvtsi32_si128(two));
                let scale = spread_pair(_mm_mul_ps(w_scale, x_scale));
                *acc = _mm512_fmadd_ps(scale, partials, *acc);
            }
            b += 2;
        }
        if b < blocks {
            for (i, acc) in acc.iter_mut().enumerate() {
                let scale = (*scales(i, b)).to_f32() * *x_scales.add(b);
                *acc = last_block(codes(i, b), x.add(b * Q8_BLOCK), scale, *acc);
            }
        }
        for (i, acc) in acc.into_iter().enumerate() {
            *rows.out.add(i * rows.step) = reduce16(acc);
        }
    }
}

/// A pair's weight codes widened to i16: `(u, v)` of the module docs.
///
/// # Safety
/// AVX-512 BW; `w` readable for 64 bytes.
#[inline(always)]
unsafe fn widen_pair(w: *const i8) -> (__m512i, __m512i) {
    // SAFETY: as the caller guarantees.
    unsafe {
        let u = _mm512_cvtepi8_epi16(_mm256_loadu_si256(w.add(16) as *const __m256i));
        let v_bytes = _mm256_inserti128_si256::<1>(
            _mm256_castsi128_si256(_mm_loadu_si128(w as *const __m128i)),
            _mm_loadu_si128(w.add(48) as *const __m128i),
        );
        (u, _mm512_cvtepi8_epi16(v_bytes))
    }
}

/// The 16 canonical partial sums of a pair (block `b` in lanes 0..8, `b + 1` in 8..16), as
/// f32 (exact), from its widened weights and its 64 activation codes in [`CodeOrder::Paired`].
///
/// # Safety
/// AVX-512 BW (+VNNI for [`Vnni`]); `x` readable for 64 codes.
#[inline(always)]
unsafe fn pair_partials<S: PairSums>((u, v): (__m512i, __m512i), x: *const i16) -> __m512 {
    // SAFETY: as the caller guarantees.
    unsafe {
        let xu = _mm512_loadu_si512(x as *const __m512i);
        let xv = _mm512_loadu_si512(x.add(32) as *const __m512i);
        _mm512_cvtepi32_ps(S::sums(u, xu, v, xv))
    }
}

/// `s[0]` in lanes 0..8 and `s[1]` in lanes 8..16.
///
/// # Safety
/// AVX-512 F; `s` readable for two floats.
#[inline(always)]
unsafe fn pair_scales(s: *const f32) -> __m512 {
    // SAFETY: as the caller guarantees (a 64-bit load).
    unsafe { spread_pair(_mm_castpd_ps(_mm_load_sd(s as *const f64))) }
}

/// Lane 0 of `two` in lanes 0..8, lane 1 in lanes 8..16.
///
/// # Safety
/// AVX-512 F.
#[inline(always)]
unsafe fn spread_pair(two: __m128) -> __m512 {
    // SAFETY: as the caller guarantees.
    unsafe {
        let spread = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
        _mm512_permutexvar_ps(spread, _mm512_castps128_ps512(two))
    }
}

/// An odd last block into lanes 0..8 of `acc` (it is an even block), lanes 8..16 untouched.
///
/// # Safety
/// AVX-512 F/VL, AVX2+FMA; `w` readable for 32 bytes, `x` for 32 codes.
#[inline(always)]
unsafe fn last_block(w: *const i8, x: *const i16, scale: f32, acc: __m512) -> __m512 {
    // SAFETY: as the caller guarantees.
    unsafe {
        let w_low = _mm256_cvtepi8_epi16(_mm_loadu_si128(w as *const __m128i));
        let w_high = _mm256_cvtepi8_epi16(_mm_loadu_si128(w.add(16) as *const __m128i));
        let low = _mm256_madd_epi16(w_low, _mm256_loadu_si256(x as *const __m256i));
        let high = _mm256_madd_epi16(w_high, _mm256_loadu_si256(x.add(16) as *const __m256i));
        let partials = _mm512_castps256_ps512(_mm256_cvtepi32_ps(_mm256_add_epi32(low, high)));
        _mm512_mask3_fmadd_ps(_mm512_set1_ps(scale), partials, acc, 0x00ff)
    }
}

/// One weight row: its codes and its block scales widened to f32 (plus one spare).
struct Row {
    codes: *const i8,
    scales: *const f32,
    k: usize,
}

/// Dot products of `row` with `N` consecutive tokens (codes `x` in [`CodeOrder::Paired`], block
/// scales `x_scales`, rows of k / k/32), stored at `out + j·y_stride`.
///
/// # Safety
/// AVX-512 F/BW/VL (+AVX2/FMA, VNNI for [`Vnni`]); the `N` tokens inside `x` and
/// `x_scales`, `out` writable at those offsets.
#[inline(always)]
unsafe fn tokens<S: PairSums, const N: usize>(
    row: &Row,
    x: *const i16,
    x_scales: *const f32,
    out: *mut f32,
    y_stride: usize,
) {
    let (k, blocks) = (row.k, row.k / Q8_BLOCK);
    // SAFETY: as the caller guarantees; block b (and b + 1 in the pair loop) lies inside the
    // row and each token.
    unsafe {
        let mut acc = [_mm512_setzero_ps(); N];
        let mut b = 0;
        while b + 2 <= blocks {
            let w = widen_pair(row.codes.add(b * Q8_BLOCK));
            let w_scales = pair_scales(row.scales.add(b));
            for (j, acc) in acc.iter_mut().enumerate() {
                let partials = pair_partials::<S>(w, x.add(j * k + b * Q8_BLOCK));
                let x_scale = pair_scales(x_scales.add(j * blocks + b));
                *acc = _mm512_fmadd_ps(_mm512_mul_ps(w_scales, x_scale), partials, *acc);
            }
            b += 2;
        }
        if b < blocks {
            for (j, acc) in acc.iter_mut().enumerate() {
                let scale = *row.scales.add(b) * *x_scales.add(j * blocks + b);
                let at = x.add(j * k + b * Q8_BLOCK);
                *acc = last_block(row.codes.add(b * Q8_BLOCK), at, scale, *acc);
            }
        }
        for (j, acc) in acc.into_iter().enumerate() {
            *out.add(j * y_stride) = reduce16(acc);
        }
    }
}

/// Every variant this CPU runs, for the parity suite.
#[cfg(any(test, feature = "parity"))]
pub(crate) fn runnable_variants() -> Vec<Variant> {
    let mut variants = vec![Variant::Madd];
    if Variant::detected() == Variant::Vnni {
        variants.push(Variant::Vnni);
    }
    variants
}
