//! Attention scores straight from a page of cached keys, for every query head of a KV head:
//! fp16 rows, or packed codes scored against their codebook levels (rotated domain).
//!
//! Shapes: `queries` `[n_qh][d]` (already scaled); `scores[qh · stride + j]` for the page's
//! `rows` tokens (`rows <= stride`). Each key row is read and decoded once for all query
//! heads. SIMD versions reorder the dot products' sums: tolerance `1e-5 · Σ|q_c·k_c|`.

crate::isa::isa_modules!(scalar, avx2, avx512, quad);

pub mod int_dot;

use crate::codes::{CodeLayout, CodedRows, Levels};
use crate::isa::{active_isa, dispatch, Isa};
use half::f16;

/// `scores[qh·stride + j] = Σ_c queries[qh][c] · keys[j][c]` for the `keys.len() / d` rows.
pub fn score_f16(keys: &[f16], d: usize, queries: &[f32], scores: &mut [f32], stride: usize) {
    check(d, keys.len() / d.max(1), queries, scores.len(), stride);
    assert_eq!(keys.len() % d, 0, "score_f16: keys is not [rows][d]");
    // SAFETY: active_isa() only returns ISAs validated against this CPU; shapes checked.
    unsafe { score_f16_on(active_isa(), keys, d, queries, scores, stride) }
}

/// `scores[qh·stride + j] = scales[j] · Σ_c queries[qh][c] · level_c(code_{j,c})` for the
/// `scales.len()` rows packed back to back in `codes` (`layout.bytes()` each).
#[allow(clippy::too_many_arguments)]
pub fn score_codes(
    codes: &[u8],
    layout: &CodeLayout,
    levels: Levels<'_>,
    scales: &[f32],
    queries: &[f32],
    scores: &mut [f32],
    stride: usize,
) {
    check_codes(codes, layout, levels, scales.len());
    check(layout.d, scales.len(), queries, scores.len(), stride);
    // SAFETY: as above.
    unsafe {
        score_codes_on(
            active_isa(),
            CodedRows::new(codes, layout, levels, scales),
            queries,
            scores,
            stride,
        )
    }
}

pub(crate) fn check(d: usize, rows: usize, queries: &[f32], scores_len: usize, stride: usize) {
    assert!(
        d > 0 && d <= crate::MAX_CODED_DIM,
        "kv: head dim out of range"
    );
    assert_eq!(queries.len() % d, 0, "kv: queries is not [n_qh][d]");
    assert!(rows <= stride, "kv: more rows than the stride");
    let n_qh = queries.len() / d;
    assert!(
        n_qh == 0 || scores_len >= (n_qh - 1) * stride + rows,
        "kv: scores shorter than [n_qh][stride]"
    );
}

pub(crate) fn check_codes(codes: &[u8], layout: &CodeLayout, levels: Levels<'_>, rows: usize) {
    assert!(
        (1..=8).contains(&layout.hi) && (1..=8).contains(&layout.lo) && layout.n_hi <= layout.d,
        "kv: bad code layout"
    );
    levels.check(layout);
    assert!(
        codes.len() >= rows * layout.bytes(),
        "kv: codes shorter than the rows"
    );
}

/// Row-at-a-time scoring every ISA shares (the reference, and the SIMD fallback for large
/// head dims): key row `j` is widened by the ISA's `convert`, then dotted with every query.
#[inline(always)]
pub(crate) fn score_f16_rows(
    keys: &[f16],
    d: usize,
    queries: &[f32],
    scores: &mut [f32],
    stride: usize,
    convert: impl Fn(&[f16], &mut [f32]),
    dot: impl Fn(&[f32], &[f32]) -> f32,
) {
    let decode = |j: usize, row: &mut [f32]| convert(&keys[j * d..(j + 1) * d], row);
    score_rows(
        d,
        keys.len() / d,
        None,
        queries,
        scores,
        stride,
        decode,
        dot,
    );
}

/// As [`score_f16_rows`] for code rows: row `j` decoded by `decode(j · layout.bytes(), row)`
/// (its byte offset in `r.codes`), its scores times its scale.
#[inline(always)]
pub(crate) fn score_code_rows(
    r: CodedRows<'_>,
    queries: &[f32],
    scores: &mut [f32],
    stride: usize,
    decode: impl Fn(usize, &mut [f32]),
    dot: impl Fn(&[f32], &[f32]) -> f32,
) {
    let (d, bytes) = (r.layout.d, r.layout.bytes());
    let decode = |j: usize, row: &mut [f32]| decode(j * bytes, row);
    score_rows(
        d,
        r.scales.len(),
        Some(r.scales),
        queries,
        scores,
        stride,
        decode,
        dot,
    );
}

#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn score_rows(
    d: usize,
    rows: usize,
    scales: Option<&[f32]>,
    queries: &[f32],
    scores: &mut [f32],
    stride: usize,
    decode: impl Fn(usize, &mut [f32]),
    dot: impl Fn(&[f32], &[f32]) -> f32,
) {
    let mut row = crate::simd::RowBuf::new();
    let row = &mut row.0[..d];
    for j in 0..rows {
        decode(j, row);
        for (qh, q) in queries.chunks_exact(d).enumerate() {
            let dot = dot(q, row);
            scores[qh * stride + j] = scales.map_or(dot, |s| s[j] * dot);
        }
    }
}

/// # Safety
/// `isa` must run on this CPU; shapes as checked by [`score_f16`].
pub(crate) unsafe fn score_f16_on(
    isa: Isa,
    keys: &[f16],
    d: usize,
    queries: &[f32],
    scores: &mut [f32],
    stride: usize,
) {
    dispatch!(isa, score_f16(keys, d, queries, scores, stride))
}

/// # Safety
/// `isa` must run on this CPU; shapes as checked by [`score_codes`].
pub(crate) unsafe fn score_codes_on(
    isa: Isa,
    r: CodedRows<'_>,
    queries: &[f32],
    scores: &mut [f32],
    stride: usize,
) {
    dispatch!(isa, score_codes(r, queries, scores, stride))
}

/// Random codes of a layout, packed, with codebook-like levels (parity and benchmarks).
#[cfg(any(test, feature = "parity"))]
pub(crate) fn random_block(
    rng: &mut crate::test_util::Rng,
    layout: &CodeLayout,
    rows: usize,
) -> (Vec<u8>, Vec<f32>, Vec<f32>) {
    let bytes = layout.bytes();
    let mut packed = vec![0u8; rows * bytes];
    let mut codes = vec![0u8; layout.d];
    for j in 0..rows {
        for (c, code) in codes.iter_mut().enumerate() {
            *code = rng.below(1 << layout.width(c)) as u8;
        }
        crate::codes::scalar::pack(&codes, layout, &mut packed[j * bytes..(j + 1) * bytes]);
    }
    let hi = (0..1 << layout.hi).map(|_| rng.uniform() * 0.3).collect();
    let lo = (0..1 << layout.lo).map(|_| rng.uniform() * 0.3).collect();
    (packed, hi, lo)
}

/// Layouts the kv parity checks sweep: the presets' rates at head dim 64 and 128, then the
/// awkward dims at 3.5 and 3 bits.
#[cfg(any(test, feature = "parity"))]
pub(crate) fn parity_layouts() -> Vec<CodeLayout> {
    let mut layouts = Vec::new();
    for d in [64usize, 128] {
        for half_bits in [2u8, 3, 4, 5, 6, 7, 8, 10, 11, 16] {
            layouts.push(CodeLayout::for_half_bits(d, half_bits));
        }
    }
    for &d in &crate::test_util::AWKWARD_SIZES[..13] {
        layouts.push(CodeLayout::for_half_bits(d, 7));
        layouts.push(CodeLayout::for_half_bits(d, 6));
    }
    layouts
}

/// Runs `check(rng, layout, block, n_qh, rows)` on a random coded block of every parity layout
/// and (query heads, rows) shape: codebook-like levels, per-row scales in [1, 2).
#[cfg(any(test, feature = "parity"))]
pub(crate) fn for_each_coded_block(
    rng: &mut crate::test_util::Rng,
    mut check: impl FnMut(
        &mut crate::test_util::Rng,
        &CodeLayout,
        CodedRows<'_>,
        usize,
        usize,
    ) -> crate::test_util::Check,
) -> crate::test_util::Check {
    for layout in parity_layouts() {
        // 12 and 13 heads: past the narrow value kernel's head limit (prefill's blocked path,
        // its many-heads tile and a remainder; rows 32.. a chunk with every row live).
        for (n_qh, rows) in [
            (1usize, 1usize),
            (3, 32),
            (9, 37),
            (4, 17),
            (12, 33),
            (13, 37),
        ] {
            let (packed, hi, lo) = random_block(rng, &layout, rows);
            let levels = Levels { hi: &hi, lo: &lo };
            let scales: Vec<f32> = (0..rows).map(|_| 1.0 + rng.uniform()).collect();
            let block = CodedRows::new(&packed, &layout, levels, &scales);
            check(rng, &layout, block, n_qh, rows)?;
        }
    }
    Ok(())
}

/// Runs `check(rng, d, rows_f16, n_qh, rows)` on random fp16 rows of the awkward head dims and
/// 64, 128 for every (query heads, rows) shape.
#[cfg(any(test, feature = "parity"))]
pub(crate) fn for_each_f16_block(
    rng: &mut crate::test_util::Rng,
    mut check: impl FnMut(
        &mut crate::test_util::Rng,
        usize,
        &[f16],
        usize,
        usize,
    ) -> crate::test_util::Check,
) -> crate::test_util::Check {
    use crate::test_util::{random_vec, AWKWARD_SIZES};
    // The awkward dims, then the models' head dims 64 and 128.
    for &d in AWKWARD_SIZES[..13].iter().chain(&[64, 128]) {
        // 12 to 14 heads: the value scan's many-heads tile (as for the coded blocks); a page of
        // at most 32 rows is widened once for it.
        for (n_qh, rows) in [
            (1usize, 1usize),
            (3, 32),
            (9, 37),
            (4, 33),
            (12, 33),
            (13, 37),
            (14, 20),
        ] {
            let values: Vec<f16> = random_vec(rng.next_u64(), rows * d)
                .iter()
                .map(|&v| f16::from_f32(v))
                .collect();
            check(rng, d, &values, n_qh, rows)?;
        }
    }
    Ok(())
}

#[cfg(any(test, feature = "parity"))]
pub(crate) fn parity(isa: Isa) -> crate::test_util::Check {
    use crate::test_util::*;
    let mut rng = Rng::new(5);
    let stride = 37;
    for_each_coded_block(&mut rng, |rng, layout, block, n_qh, rows| {
        let d = layout.d;
        let queries = random_vec(rng.next_u64(), n_qh * d);
        let mut want = vec![7.0f32; n_qh * stride];
        let mut got = want.clone();
        scalar::score_codes(block, &queries, &mut want, stride);
        // SAFETY: `isa` comes from the runnable list.
        unsafe { score_codes_on(isa, block, &queries, &mut got, stride) };
        // |q| < 1, |level| < 0.3, scale < 2: Σ|terms| < 0.6·d.
        canonical(isa, &got, &want, 0.6 * d as f32, &|| {
            format!(
                "score_codes d={d} {}/{}x{} n_qh={n_qh} rows={rows}",
                layout.hi, layout.lo, layout.n_hi
            )
        })
    })?;
    for_each_f16_block(&mut rng, |rng, d, keys, n_qh, rows| {
        let queries = random_vec(rng.next_u64(), n_qh * d);
        let mut want = vec![7.0f32; n_qh * stride];
        let mut got = want.clone();
        scalar::score_f16(keys, d, &queries, &mut want, stride);
        // SAFETY: `isa` comes from the runnable list.
        unsafe { score_f16_on(isa, keys, d, &queries, &mut got, stride) };
        canonical(isa, &got, &want, d as f32, &|| {
            format!("score_f16 d={d} n_qh={n_qh} rows={rows}")
        })
    })?;
    #[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
    if isa == Isa::Simd128 {
        quad::f16_blocks_parity()?;
    }
    int_dot::parity(isa)
}

/// `rows` random fp16 rows of `d` halves for the SIMD128 fp16 scans' same-bits checks: values
/// in (-1, 1) with, by `rng`, subnormal halves, signed zeros, ±65504, and in about one row in
/// six an inf or NaN half.
#[cfg(all(
    target_arch = "wasm32",
    target_feature = "simd128",
    any(test, feature = "parity")
))]
pub(crate) fn special_f16_rows(rng: &mut crate::test_util::Rng, rows: usize, d: usize) -> Vec<f16> {
    let specials = [0x0001u16, 0x83ff, 0x0000, 0x8000, 0x7bff, 0xfbff, 0x0400];
    let mut out: Vec<f16> = (0..rows * d)
        .map(|_| f16::from_f32(rng.uniform()))
        .collect();
    for row in out.chunks_exact_mut(d) {
        for _ in 0..3 {
            let c = rng.below(d as u64) as usize;
            row[c] = f16::from_bits(specials[rng.below(specials.len() as u64) as usize]);
        }
        if rng.below(6) == 0 {
            let c = rng.below(d as u64) as usize;
            row[c] = f16::from_bits([0x7c00u16, 0xfc00, 0x7e01, 0xfd00][rng.below(4) as usize]);
        }
    }
    out
}
