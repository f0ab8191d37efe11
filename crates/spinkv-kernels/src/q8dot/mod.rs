//! Q8_0 weights times block-quantized 16-bit activations: the arithmetic of every matvec and
//! matmul on Q8_0 weights (decode and prefill alike, so a token's logits do not depend on
//! which of the two computed them).
//!
//! Why quantize the activations: widening 8-bit weights to f32 for an f32 dot product made
//! Q8_0 decode compute-bound (slower than f16 despite half the bytes). With integer operands
//! each block of 32 is a few integer multiply-adds (`pmaddwd` on x86). Why 16 bits and not 8
//! as llama.cpp does: 8-bit activations cost measurable quality on SmolLM2-135M (mean KLD
//! against f16 weights 0.0048 instead of 0.0017 on the GPL-3), 16-bit ones cost nothing
//! measurable, and decode is bound by reading the weights either way.
//!
//! The canonical arithmetic (every ISA follows it, so integer sums are exact and the float
//! steps happen in one order):
//! * activations, per block of [`Q8_BLOCK`]: `amax = max |x|`, scale `d = amax / 32767`, code
//!   `clamp(round_ties_even(x · (32767 / amax)), ±32767)` (all codes 0 when `amax` is 0);
//! * per block `b`: eight exact integer partial sums `p_b[l]` over the elements
//!   [`lane_elements`]`(l)` = `2l, 2l+1, 16+2l, 17+2l` (what two `pmaddwd` over the block's
//!   halves add up to; |p| ≤ 4·128·32767 < 2^24, so `p as f32` is exact), and the block scale
//!   `s_b = f32(w_scale_b) · d_b`;
//! * 16 lanes: lane `8·(b mod 2) + l` accumulates `fma(s_b, p_b[l], lane)` from +0, in block
//!   order; the lanes are combined by `canon::reduce16`.
//!
//! SIMD128 has no fused multiply-add: it multiplies then adds (checked within tolerance).

crate::isa::isa_modules!(scalar, x86, quad);
#[cfg(target_arch = "x86_64")]
mod zmm;

use crate::isa::{dispatch, Isa};
use crate::weight::{Q8Weights, Q8_BLOCK};
use std::ops::Range;

/// Integer partial sums per block: lanes of four products each.
pub(crate) const PARTIALS: usize = Q8_BLOCK / 4;

/// The four elements of a block that partial sum `l` adds up (see the module docs).
#[inline(always)]
pub(crate) const fn lane_elements(l: usize) -> [usize; 4] {
    [2 * l, 2 * l + 1, 16 + 2 * l, 17 + 2 * l]
}

/// The largest activation code.
const CODE_MAX: f32 = 32767.0;

/// How each token's codes are ordered in [`Q8Activations::codes`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum CodeOrder {
    /// Element order: code `i` at position `i`.
    #[default]
    Canonical,
    /// Each pair of blocks stored as elements 16..48 then 0..16 and 48..64 (an odd last block
    /// as it is): the operands of the AVX-512 kernel's two `pmaddwd` (`zmm`), read in place.
    Paired,
}

impl CodeOrder {
    /// The order `isa`'s kernels read.
    pub fn for_isa(isa: Isa) -> CodeOrder {
        if isa == Isa::Avx512 {
            CodeOrder::Paired
        } else {
            CodeOrder::Canonical
        }
    }
}

/// Activations quantized in blocks of [`Q8_BLOCK`]: `n_tokens` rows of `k` 16-bit codes, one
/// f32 scale per block.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Q8Activations {
    pub codes: Vec<i16>,
    pub scales: Vec<f32>,
    /// The order of each token's codes.
    pub order: CodeOrder,
}

impl Q8Activations {
    /// `x` (`[n_tokens, k]`, `k` a multiple of [`Q8_BLOCK`]) quantized as the module docs say,
    /// in element order.
    pub fn quantize(x: &[f32]) -> Self {
        Q8Activations::quantize_in(x, Q8_BLOCK, CodeOrder::Canonical)
    }

    /// `x` (whole tokens of `k` values) quantized, each token's codes in `order`: for the
    /// kernels of an ISA, `CodeOrder::for_isa(isa)`.
    pub fn quantize_in(x: &[f32], k: usize, order: CodeOrder) -> Self {
        let mut out = Q8Activations::default();
        out.resize(x.len(), order);
        quantize_tokens(x, k, order, &mut out.codes, &mut out.scales);
        out
    }

    /// Buffers for `n` codes (a multiple of [`Q8_BLOCK`]) in `order`, contents unspecified:
    /// fill them with [`quantize_tokens`] (in parts, on several threads if wanted).
    pub fn resize(&mut self, n: usize, order: CodeOrder) {
        assert!(
            n.is_multiple_of(Q8_BLOCK),
            "q8 activations: {n} values are not whole blocks"
        );
        self.codes.resize(n, 0);
        self.scales.resize(n / Q8_BLOCK, 0.0);
        self.order = order;
    }

    /// Codes and scales of token `t` (rows of `k`), its codes in [`Q8Activations::order`].
    pub(crate) fn token(&self, t: usize, k: usize) -> (&[i16], &[f32]) {
        (
            &self.codes[t * k..(t + 1) * k],
            &self.scales[t * k / Q8_BLOCK..(t + 1) * k / Q8_BLOCK],
        )
    }

    /// These activations with their codes in `order` (borrowed when they already are).
    fn in_order(&self, k: usize, order: CodeOrder) -> std::borrow::Cow<'_, Q8Activations> {
        if self.order == order {
            return std::borrow::Cow::Borrowed(self);
        }
        let mut codes = vec![0i16; self.codes.len()];
        for (from, to) in self.codes.chunks_exact(k).zip(codes.chunks_exact_mut(k)) {
            match order {
                CodeOrder::Paired => pair_up(from, to),
                CodeOrder::Canonical => unpair(from, to),
            }
        }
        std::borrow::Cow::Owned(Q8Activations {
            codes,
            scales: self.scales.clone(),
            order,
        })
    }
}

/// Quantizes whole tokens of `k` values (`x.len()` a multiple of `k`) into `codes` (as many)
/// and `scales` (one per block), each token's codes in `order`: the work of
/// [`Q8Activations::quantize`] on a slice of its buffers.
pub fn quantize_tokens(
    x: &[f32],
    k: usize,
    order: CodeOrder,
    codes: &mut [i16],
    scales: &mut [f32],
) {
    assert!(
        k > 0 && k.is_multiple_of(Q8_BLOCK) && x.len().is_multiple_of(k),
        "q8 activations: {} values are not whole tokens of {k}",
        x.len()
    );
    assert!(codes.len() == x.len() && scales.len() == x.len() / Q8_BLOCK);
    #[cfg(target_arch = "x86_64")]
    match crate::isa::active_isa() {
        // SAFETY: the active ISA runs on this CPU.
        Isa::Avx512 => unsafe { quantize_blocks_avx512(x, codes, scales) },
        // SAFETY: as above.
        Isa::Avx2 => unsafe { quantize_blocks_avx2(x, codes, scales) },
        _ => quantize_blocks::<false>(x, codes, scales),
    }
    #[cfg(not(target_arch = "x86_64"))]
    quantize_blocks::<false>(x, codes, scales);
    if order == CodeOrder::Paired {
        let mut pair = [0i16; 2 * Q8_BLOCK];
        for token in codes.chunks_exact_mut(k) {
            for codes in token.chunks_exact_mut(2 * Q8_BLOCK) {
                pair_up(codes, &mut pair);
                codes.copy_from_slice(&pair);
            }
        }
    }
}

/// Every block of `x` quantized into `codes` / `scales` in element order (the module docs);
/// `X86` (only where AVX2 is enabled) takes each block's largest magnitude in AVX2 registers,
/// which LLVM does not make of the portable loop.
#[inline(always)]
fn quantize_blocks<const X86: bool>(x: &[f32], codes: &mut [i16], scales: &mut [f32]) {
    let blocks = x
        .chunks_exact(Q8_BLOCK)
        .zip(codes.chunks_exact_mut(Q8_BLOCK));
    for ((block, codes), scale) in blocks.zip(scales.iter_mut()) {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `X86` is set only by callers compiled with AVX2 enabled.
        let amax = if X86 {
            unsafe { block_amax_avx2(block) }
        } else {
            block_amax(block)
        };
        #[cfg(not(target_arch = "x86_64"))]
        let amax = block_amax(block);
        *scale = amax / CODE_MAX;
        let inverse = if amax > 0.0 { CODE_MAX / amax } else { 0.0 };
        for (code, &v) in codes.iter_mut().zip(block) {
            *code = round_to_code(v * inverse);
        }
    }
}

/// The largest `|v|` of a block. A NaN never compares greater, so it is skipped (as
/// `f32::max` skips it) and, every value being non-negative, the order cannot change the
/// result: sixteen running maxima, then their maximum (an order and a comparison, `maxps`,
/// that vectorize).
#[inline(always)]
fn block_amax(block: &[f32]) -> f32 {
    let larger = |m: f32, v: f32| if v > m { v } else { m };
    let mut lanes = [0.0f32; 16];
    for part in block.chunks_exact(16) {
        for (lane, v) in lanes.iter_mut().zip(part) {
            *lane = larger(*lane, v.abs());
        }
    }
    lanes.iter().fold(0.0f32, |m, &v| larger(m, v))
}

/// [`block_amax`] in AVX2 registers: `maxps(v, m)` keeps `m` when `v` is NaN, the same skip,
/// and the maximum of non-negative values does not depend on the order.
///
/// # Safety
/// AVX2 enabled in the caller; `block` whole groups of 8.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn block_amax_avx2(block: &[f32]) -> f32 {
    use std::arch::x86_64::*;
    // SAFETY: every load reads 8 values of `block`; AVX2 (caller).
    unsafe {
        let magnitude = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fff_ffff));
        let mut m = _mm256_setzero_ps();
        for part in block.chunks_exact(8) {
            let v = _mm256_and_ps(_mm256_loadu_ps(part.as_ptr()), magnitude);
            m = _mm256_max_ps(v, m);
        }
        let m = _mm_max_ps(_mm256_extractf128_ps::<1>(m), _mm256_castps256_ps128(m));
        let m = _mm_max_ps(_mm_movehl_ps(m, m), m);
        _mm_cvtss_f32(_mm_max_ss(_mm_movehdup_ps(m), m))
    }
}

/// [`quantize_blocks`] compiled for AVX-512: the same operations on wider lanes (no operation
/// in it depends on the vector width, so the codes and scales are the same bits).
///
/// # Safety
/// AVX-512 F/BW/VL available.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma")]
unsafe fn quantize_blocks_avx512(x: &[f32], codes: &mut [i16], scales: &mut [f32]) {
    quantize_blocks::<true>(x, codes, scales)
}

/// [`quantize_blocks`] compiled for AVX2, as [`quantize_blocks_avx512`] is for AVX-512 (the
/// baseline build's SSE2 loop took ~5 % of an AVX2 Q8_0 prefill).
///
/// # Safety
/// AVX2 and FMA available.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn quantize_blocks_avx2(x: &[f32], codes: &mut [i16], scales: &mut [f32]) {
    quantize_blocks::<true>(x, codes, scales)
}

/// One token's codes (`from`, element order) in [`CodeOrder::Paired`] (`to`).
fn pair_up(from: &[i16], to: &mut [i16]) {
    const PAIR: usize = 2 * Q8_BLOCK;
    let pairs = from.len() / PAIR;
    for (src, dst) in from.chunks_exact(PAIR).zip(to.chunks_exact_mut(PAIR)) {
        dst[..32].copy_from_slice(&src[16..48]);
        dst[32..48].copy_from_slice(&src[..16]);
        dst[48..].copy_from_slice(&src[48..]);
    }
    to[pairs * PAIR..].copy_from_slice(&from[pairs * PAIR..]);
}

/// The inverse of [`pair_up`].
fn unpair(from: &[i16], to: &mut [i16]) {
    const PAIR: usize = 2 * Q8_BLOCK;
    let pairs = from.len() / PAIR;
    for (src, dst) in from.chunks_exact(PAIR).zip(to.chunks_exact_mut(PAIR)) {
        dst[16..48].copy_from_slice(&src[..32]);
        dst[..16].copy_from_slice(&src[32..48]);
        dst[48..].copy_from_slice(&src[48..]);
    }
    to[pairs * PAIR..].copy_from_slice(&from[pairs * PAIR..]);
}

/// `round_ties_even(v)` clamped to ±32767 (NaN gives 0), in operations that vectorize
/// ([`crate::round`]).
#[inline(always)]
fn round_to_code(v: f32) -> i16 {
    // Clamping first is the same as after rounding: the bounds are integers.
    crate::round::round_even_int(v.clamp(-CODE_MAX, CODE_MAX)) as i16
}

/// `y[r - rows.start] = W[r, :] · x` for Q8_0 weights (`k` a multiple of [`Q8_BLOCK`]), `x`
/// quantized first.
///
/// # Safety
/// `isa` must run on this CPU.
pub(crate) unsafe fn matvec_on(
    isa: Isa,
    w: Q8Weights<'_>,
    k: usize,
    x: &[f32],
    rows: Range<usize>,
    y: &mut [f32],
) {
    assert_eq!(x.len(), k, "q8 matvec: x is not [k]");
    // SAFETY: `isa` runs on this CPU (caller); one token is a matmul of one row.
    unsafe { matmul_on(isa, w, k, x, rows, y) }
}

/// Tokens taken together by the matmul: their codes stay in L2 while every weight row of the
/// range streams past them once.
const MATMUL_TOKENS: usize = 64;

/// `Y[t, r - rows.start] = X[t, :] · W[r, :]` for Q8_0 weights; `x`: `[n_tokens, k]`, `y`:
/// `[n_tokens, rows.len()]`. Each output is the same dot product [`matvec_on`] computes.
///
/// # Safety
/// `isa` must run on this CPU.
pub(crate) unsafe fn matmul_on(
    isa: Isa,
    w: Q8Weights<'_>,
    k: usize,
    x: &[f32],
    rows: Range<usize>,
    y: &mut [f32],
) {
    check(w, k, &rows);
    assert_eq!(x.len() % k, 0, "q8 matmul: x is not [n_tokens, k]");
    assert_eq!(
        y.len(),
        x.len() / k * rows.len(),
        "q8 matmul: y is not [n_tokens, rows]"
    );
    let xq = Q8Activations::quantize_in(x, k, CodeOrder::for_isa(isa));
    // SAFETY: `isa` runs on this CPU (caller).
    unsafe { matmul_quantized_on(isa, w, k, &xq, rows, y) }
}

/// As [`matmul_on`] with the activations already quantized (`xq`: `n_tokens` rows of `k`),
/// on the active ISA: callers that split one product into row tasks quantize the shared
/// input once instead of once per task (in decode that quantization cost ~7 % of the time).
pub fn matmul_quantized(
    w: Q8Weights<'_>,
    k: usize,
    xq: &Q8Activations,
    rows: Range<usize>,
    y: &mut [f32],
) {
    // SAFETY: active_isa() only returns ISAs validated against this CPU.
    unsafe { matmul_quantized_on(crate::isa::active_isa(), w, k, xq, rows, y) }
}

/// # Safety
/// `isa` must run on this CPU.
pub(crate) unsafe fn matmul_quantized_on(
    isa: Isa,
    w: Q8Weights<'_>,
    k: usize,
    xq: &Q8Activations,
    rows: Range<usize>,
    y: &mut [f32],
) {
    check(w, k, &rows);
    assert!(
        xq.codes.len().is_multiple_of(k) && xq.codes.len() == xq.scales.len() * Q8_BLOCK,
        "q8 matmul: activations are not [n_tokens, k]"
    );
    // Activations quantized for another ISA's kernels (a caller's choice, never the model's).
    let xq = xq.in_order(k, CodeOrder::for_isa(isa));
    let xq = xq.as_ref();
    let n_tokens = xq.codes.len() / k;
    let n_out = rows.len();
    assert_eq!(
        y.len(),
        n_tokens * n_out,
        "q8 matmul: y is not [n_tokens, rows]"
    );
    for first in (0..n_tokens).step_by(MATMUL_TOKENS) {
        let tokens = first..(first + MATMUL_TOKENS).min(n_tokens);
        let tile = Tile {
            w,
            k,
            x: xq,
            tokens,
            rows: rows.clone(),
            y_stride: n_out,
        };
        // SAFETY: shapes checked above; `isa` runs on this CPU (caller).
        unsafe { dot_tile_on(isa, tile, y) }
    }
}

/// One call's work: the dot products of weight `rows` with activation `tokens`, written to
/// `y[t * y_stride + (r - rows.start)]`.
#[derive(Clone)]
pub struct Tile<'a> {
    pub w: Q8Weights<'a>,
    pub k: usize,
    pub x: &'a Q8Activations,
    pub tokens: Range<usize>,
    pub rows: Range<usize>,
    pub y_stride: usize,
}

impl Tile<'_> {
    /// Every bound the kernels' pointer arithmetic relies on.
    fn check(&self, y: &[f32]) {
        let blocks = self.k / Q8_BLOCK;
        check(self.w, self.k, &self.rows);
        assert!(self.w.scales.len() >= self.rows.end * blocks);
        assert!(self.x.codes.len() >= self.tokens.end * self.k);
        assert!(self.x.scales.len() >= self.tokens.end * blocks);
        assert!(self.rows.len() <= self.y_stride || self.tokens.is_empty());
        assert!(y.len() >= self.tokens.end.saturating_sub(1) * self.y_stride + self.rows.len());
    }
}

impl Tile<'_> {
    /// Calls `dot(weight codes, weight scales, activation codes, activation scales)` for every
    /// (token, row) of the tile and stores the result at its place in `y`: the walk of the
    /// kernels that compute one output at a time.
    #[cfg_attr(
        not(any(target_arch = "aarch64", target_arch = "wasm32")),
        allow(dead_code)
    )]
    #[inline(always)]
    pub(crate) fn for_each_output(
        &self,
        y: &mut [f32],
        mut dot: impl FnMut(&[i8], &[half::f16], &[i16], &[f32]) -> f32,
    ) {
        let (k, blocks) = (self.k, self.k / Q8_BLOCK);
        for t in self.tokens.clone() {
            let (x_codes, x_scales) = self.x.token(t, k);
            for r in self.rows.clone() {
                let codes = &self.w.codes[r * k..(r + 1) * k];
                let scales = &self.w.scales[r * blocks..(r + 1) * blocks];
                y[t * self.y_stride + (r - self.rows.start)] =
                    dot(codes, scales, x_codes, x_scales);
            }
        }
    }
}

/// # Safety
/// `isa` must run on this CPU.
unsafe fn dot_tile_on(isa: Isa, tile: Tile<'_>, y: &mut [f32]) {
    tile.check(y);
    dispatch!(isa, dot_tile(tile, y))
}

fn check(w: Q8Weights<'_>, k: usize, rows: &Range<usize>) {
    assert!(
        k > 0 && k.is_multiple_of(Q8_BLOCK),
        "q8: rows of {k} weights are not whole blocks"
    );
    assert!(rows.start <= rows.end, "q8: reversed row range");
    assert!(
        w.codes.len() >= rows.end * k,
        "q8: weight has fewer than {} rows",
        rows.end
    );
}

#[cfg(any(test, feature = "parity"))]
pub(crate) fn parity(isa: Isa) -> crate::test_util::Check {
    // AVX-512 has two integer variants (VNNI and not): each must match on its own.
    #[cfg(target_arch = "x86_64")]
    if isa == Isa::Avx512 {
        if !std::arch::is_x86_feature_detected!("avx512vnni") {
            eprintln!("skipped: avx512 q8dot Vnni: this CPU lacks avx512vnni (Madd checked)");
        }
        for variant in zmm::runnable_variants() {
            FORCED_ZMM_VARIANT.with(|v| v.set(Some(variant)));
            let result = parity_of(isa).map_err(|e| format!("{variant:?}: {e}"));
            FORCED_ZMM_VARIANT.with(|v| v.set(None));
            result?;
        }
        return Ok(());
    }
    parity_of(isa)
}

#[cfg(all(target_arch = "x86_64", any(test, feature = "parity")))]
thread_local! {
    /// The AVX-512 variant the parity check forces on its own thread (None: detected).
    static FORCED_ZMM_VARIANT: std::cell::Cell<Option<zmm::Variant>> =
        const { std::cell::Cell::new(None) };
}

/// The variant the AVX-512 tile kernel runs: the detected one, or the parity check's.
#[cfg(target_arch = "x86_64")]
fn zmm_variant() -> zmm::Variant {
    #[cfg(any(test, feature = "parity"))]
    if let Some(variant) = FORCED_ZMM_VARIANT.with(|v| v.get()) {
        return variant;
    }
    zmm::Variant::detected()
}

#[cfg(any(test, feature = "parity"))]
fn parity_of(isa: Isa) -> crate::test_util::Check {
    use crate::test_util::*;
    for &k in &Q8_SIZES {
        for &n_rows in &[1usize, 5, 17, 70] {
            let (codes, scales) = random_q8(k as u64 * 7 + n_rows as u64, n_rows * k);
            let w = Q8Weights::new(&codes, &scales).unwrap();
            for n_tokens in [1usize, 5, 11] {
                let x = random_vec(k as u64 + 11 * n_tokens as u64, n_tokens * k);
                for rows in [0..n_rows, n_rows / 2..n_rows] {
                    let n = rows.len() * n_tokens;
                    let (mut expected, mut got) = (vec![0.0; n], vec![0.0; n]);
                    // SAFETY: scalar runs everywhere; `isa` comes from the runnable list.
                    unsafe {
                        matmul_on(Isa::Scalar, w, k, &x, rows.clone(), &mut expected);
                        matmul_on(isa, w, k, &x, rows.clone(), &mut got);
                    }
                    canonical(isa, &got, &expected, k as f32, &|| {
                        format!("q8 matmul k={k} tokens={n_tokens} rows={rows:?}")
                    })?;
                    if n_tokens == 1 {
                        let mut matvec = vec![0.0; rows.len()];
                        // SAFETY: as above.
                        unsafe { matvec_on(isa, w, k, &x, rows.clone(), &mut matvec) };
                        identical(&matvec, &got, &|| {
                            format!("q8 matvec differs from matmul k={k} rows={rows:?}")
                        })?;
                    }
                }
            }
        }
    }
    // A row longer than the decode kernels' block-scale buffer (16,384 weights on x86).
    let k = 515 * Q8_BLOCK;
    let (codes, scales) = random_q8(515, 3 * k);
    let w = Q8Weights::new(&codes, &scales).unwrap();
    let x = random_vec(516, k);
    let (mut expected, mut got) = (vec![0.0; 3], vec![0.0; 3]);
    // SAFETY: scalar runs everywhere; `isa` comes from the runnable list.
    unsafe {
        matvec_on(Isa::Scalar, w, k, &x, 0..3, &mut expected);
        matvec_on(isa, w, k, &x, 0..3, &mut got);
    }
    canonical(isa, &got, &expected, k as f32, &|| {
        format!("q8 matvec k={k}")
    })?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_util::{random_q8, random_vec};

    #[test]
    fn rounding_is_ties_to_even() {
        for v in [
            -32767.4f32,
            -2.5,
            -1.5,
            -0.5,
            0.0,
            0.49999997,
            0.5,
            1.5,
            2.5,
            126.5,
            32766.5,
            32767.6,
        ] {
            let want = v.round_ties_even().clamp(-CODE_MAX, CODE_MAX) as i16;
            assert_eq!(round_to_code(v), want, "{v}");
        }
        assert_eq!(round_to_code(f32::NAN), 0);
        assert_eq!(round_to_code(f32::INFINITY), 32767);
        assert_eq!(round_to_code(f32::NEG_INFINITY), -32767);
    }

    #[test]
    fn activation_codes_are_within_half_a_step() {
        let mut x = random_vec(5, 4 * Q8_BLOCK);
        x[Q8_BLOCK..2 * Q8_BLOCK].fill(0.0);
        x[2 * Q8_BLOCK] = -3.5;
        let q = Q8Activations::quantize(&x);
        for (i, &v) in x.iter().enumerate() {
            let d = q.scales[i / Q8_BLOCK];
            let back = q.codes[i] as f32 * d;
            assert!(
                (back - v).abs() <= d * 0.5001 + 1e-7,
                "x[{i}]={v} came back {back}"
            );
        }
        assert_eq!(q.scales[1], 0.0);
        assert_eq!(q.codes[2 * Q8_BLOCK], -32767);
        assert!(q.codes.iter().all(|&c| c != i16::MIN));
    }

    #[test]
    fn pair_order_round_trips_and_either_order_gives_the_same_products() {
        for &k in &crate::test_util::Q8_SIZES {
            let x = random_vec(k as u64 + 3, 3 * k);
            let canonical = Q8Activations::quantize(&x);
            let mut paired = Q8Activations::default();
            paired.resize(x.len(), CodeOrder::Paired);
            quantize_tokens(
                &x,
                k,
                CodeOrder::Paired,
                &mut paired.codes,
                &mut paired.scales,
            );
            assert_eq!(paired.scales, canonical.scales);
            assert_eq!(
                *paired.in_order(k, CodeOrder::Canonical),
                canonical,
                "k={k}"
            );
            assert_eq!(*canonical.in_order(k, CodeOrder::Paired), paired, "k={k}");
            let (codes, scales) = random_q8(k as u64 + 5, 4 * k);
            let w = Q8Weights::new(&codes, &scales).unwrap();
            for isa in crate::runnable_isas() {
                let (mut a, mut b) = (vec![0.0; 12], vec![0.0; 12]);
                // SAFETY: `isa` comes from the runnable list.
                unsafe {
                    matmul_quantized_on(isa, w, k, &canonical, 0..4, &mut a);
                    matmul_quantized_on(isa, w, k, &paired, 0..4, &mut b);
                }
                assert_eq!(a, b, "{isa:?} k={k}");
            }
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn simd_quantization_gives_the_same_bits() {
        let mut x = random_vec(77, 40 * Q8_BLOCK);
        x[..Q8_BLOCK].fill(0.0);
        x[Q8_BLOCK] = 1e30;
        x[2 * Q8_BLOCK] = -1e-30;
        x[3 * Q8_BLOCK + 5] = f32::MIN_POSITIVE;
        let (mut want, mut want_scales) = (vec![0i16; x.len()], vec![0.0f32; 40]);
        x[4 * Q8_BLOCK + 3] = f32::NAN;
        x[5 * Q8_BLOCK + 30] = f32::NEG_INFINITY;
        quantize_blocks::<false>(&x, &mut want, &mut want_scales);
        let bits = |v: &[f32]| v.iter().map(|s| s.to_bits()).collect::<Vec<_>>();
        type Variant = unsafe fn(&[f32], &mut [i16], &mut [f32]);
        let variants: [(Isa, Variant); 2] = [
            (Isa::Avx2, quantize_blocks_avx2),
            (Isa::Avx512, quantize_blocks_avx512),
        ];
        for (isa, variant) in variants {
            if !isa.cpu_supports() {
                eprintln!("skipped: {isa:?} quantization: this CPU lacks it");
                continue;
            }
            let (mut got, mut scales) = (vec![0i16; x.len()], vec![0.0f32; 40]);
            // SAFETY: checked above.
            unsafe { variant(&x, &mut got, &mut scales) };
            assert_eq!(got, want, "{isa:?}");
            assert_eq!(bits(&scales), bits(&want_scales), "{isa:?}");
        }
    }

    /// The integer path computes the plain dot product of the dequantized operands (up to
    /// float rounding): a definition independent of the lane bookkeeping.
    #[test]
    fn scalar_equals_the_dot_of_dequantized_operands() {
        for &k in &crate::test_util::Q8_SIZES {
            let (codes, scales) = random_q8(k as u64, 3 * k);
            let w = Q8Weights::new(&codes, &scales).unwrap();
            let x = random_vec(k as u64 + 1, k);
            let xq = Q8Activations::quantize(&x);
            let mut y = vec![0.0; 3];
            // SAFETY: scalar runs everywhere.
            unsafe { matvec_on(Isa::Scalar, w, k, &x, 0..3, &mut y) };
            for (r, &got) in y.iter().enumerate() {
                let expected: f64 = (0..k)
                    .map(|i| {
                        let wi = codes[r * k + i] as f64 * scales[(r * k + i) / 32].to_f64();
                        wi * (xq.codes[i] as f64 * xq.scales[i / 32] as f64)
                    })
                    .sum();
                let magnitude: f64 = (0..k).map(|i| (w.get(r * k + i) * x[i]).abs() as f64).sum();
                assert!(
                    (got as f64 - expected).abs() <= 1e-6 * magnitude.max(1e-30),
                    "k={k} row {r}: {got} vs {expected}"
                );
            }
        }
    }
}
