//! Attention-weighted sums of a page of cached values, for every query head of a KV head:
//! fp16 rows, or packed codes accumulated as codebook levels (in the codec's rotated domain;
//! the caller rotates the sum back once per step).
//!
//! Shapes: `weights[qh · stride + j]` for the page's `rows` tokens; `acc` `[n_qh][d]`, added
//! to. Each value row is read and decoded once for all query heads; a token whose weights are
//! all zero (causally masked) is skipped, and so is each zero weight. Float tolerance:
//! `1e-5 · (|acc| + Σ_j |w_j·v_j|)` per element.

crate::isa::isa_modules!(scalar, x86, quad);
#[cfg(target_arch = "x86_64")]
mod narrow;
#[cfg(target_arch = "x86_64")]
mod narrow_vbmi;

use crate::codes::{CodeLayout, CodedRows, Levels};
use crate::isa::{active_isa, dispatch, Isa};
use crate::kv_score::{check, check_codes};
use crate::simd::RowBuf;
use half::f16;

/// `acc[qh][c] += Σ_j weights[qh·stride + j] · values[j][c]` over the `values.len() / d` rows.
pub fn accumulate_f16(values: &[f16], d: usize, weights: &[f32], stride: usize, acc: &mut [f32]) {
    let rows = values.len() / d.max(1);
    check(d, rows, acc, weights.len(), stride);
    assert_eq!(
        values.len() % d,
        0,
        "accumulate_f16: values is not [rows][d]"
    );
    // SAFETY: active_isa() only returns ISAs validated against this CPU; shapes checked.
    unsafe { accumulate_f16_on(active_isa(), values, d, weights, stride, acc) }
}

/// `acc[qh][c] += Σ_j weights[qh·stride + j] · scales[j] · level_c(code_{j,c})` over the
/// `scales.len()` rows packed back to back in `codes`.
#[allow(clippy::too_many_arguments)]
pub fn accumulate_codes(
    codes: &[u8],
    layout: &CodeLayout,
    levels: Levels<'_>,
    scales: &[f32],
    weights: &[f32],
    stride: usize,
    acc: &mut [f32],
) {
    check_codes(codes, layout, levels, scales.len());
    check(layout.d, scales.len(), acc, weights.len(), stride);
    // SAFETY: as above.
    unsafe {
        accumulate_codes_on(
            active_isa(),
            CodedRows::new(codes, layout, levels, scales),
            weights,
            stride,
            acc,
        )
    }
}

/// [`accumulate_codes`] over a run of pages scanned as one tile: row `j` is row
/// `j % page_rows` of `pages[j / page_rows]`; `scales` and the weights' columns run over the
/// whole run. Rows are taken in order, so the result is exactly that of one
/// [`accumulate_codes`] call per page (the reference); kernels that keep state across rows (the
/// AVX2 narrow tile) set it up once per run instead of once per page.
#[allow(clippy::too_many_arguments)]
pub fn accumulate_code_pages(
    pages: &[&[u8]],
    page_rows: usize,
    layout: &CodeLayout,
    levels: Levels<'_>,
    scales: &[f32],
    weights: &[f32],
    stride: usize,
    acc: &mut [f32],
) {
    let rows = scales.len();
    assert!(page_rows > 0, "accumulate_code_pages: empty pages");
    assert!(
        pages.len() >= rows.div_ceil(page_rows),
        "accumulate_code_pages: fewer pages than the rows"
    );
    for (p, page) in pages.iter().enumerate().take(rows.div_ceil(page_rows)) {
        let in_page = (rows - p * page_rows).min(page_rows);
        check_codes(page, layout, levels, in_page);
    }
    check(layout.d, rows, acc, weights.len(), stride);
    // SAFETY: active_isa() only returns ISAs validated against this CPU; shapes checked.
    unsafe {
        accumulate_code_pages_on(
            active_isa(),
            pages,
            page_rows,
            layout,
            levels,
            scales,
            weights,
            stride,
            acc,
        )
    }
}

/// # Safety
/// `isa` must run on this CPU; shapes as checked by [`accumulate_code_pages`].
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn accumulate_code_pages_on(
    isa: Isa,
    pages: &[&[u8]],
    page_rows: usize,
    layout: &CodeLayout,
    levels: Levels<'_>,
    scales: &[f32],
    weights: &[f32],
    stride: usize,
    acc: &mut [f32],
) {
    let rows = scales.len();
    #[cfg(target_arch = "x86_64")]
    if matches!(isa, Isa::Avx2 | Isa::Avx512) && narrow::applies(layout, acc.len() / layout.d) {
        let vbmi = isa == Isa::Avx512 && narrow_vbmi::available();
        let per_call = narrow::MAX_PAGES * page_rows;
        for (i, run) in pages.chunks(narrow::MAX_PAGES).enumerate() {
            let first = i * per_call;
            if first >= rows {
                break;
            }
            let r = CodedRows::new(
                &[],
                layout,
                levels,
                &scales[first..rows.min(first + per_call)],
            );
            let weights = &weights[first..];
            // SAFETY: AVX2 is part of both x86 ISAs (the caller vouches for `isa`), VBMI was
            // detected; the run's pages hold its rows, its weights start at column `first`
            // (checked shapes).
            unsafe {
                if vbmi {
                    narrow_vbmi::accumulate_pages(run, page_rows, r, weights, stride, acc)
                } else {
                    narrow::accumulate_pages(run, page_rows, r, weights, stride, acc)
                }
            };
        }
        return;
    }
    for (p, page) in pages.iter().enumerate().take(rows.div_ceil(page_rows)) {
        let first = p * page_rows;
        let r = CodedRows::new(
            page,
            layout,
            levels,
            &scales[first..rows.min(first + page_rows)],
        );
        // SAFETY: forwarded; the page's rows and weight columns lie inside the checked shapes.
        unsafe { accumulate_codes_on(isa, r, &weights[first..], stride, acc) };
    }
}

/// Whether token `j` has a non-zero weight for any of the `n_qh` query heads.
#[inline(always)]
pub(crate) fn any_weight(weights: &[f32], stride: usize, n_qh: usize, j: usize) -> bool {
    (0..n_qh).any(|qh| weights[qh * stride + j] != 0.0)
}

/// The row-at-a-time accumulation every ISA shares: each of the `rows` rows with a non-zero
/// weight is decoded once into `row` by `decode(j, row)`, then added to the sum of every query
/// head that weights it (times its code scale, if any) through the ISA's `axpy`.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
pub(crate) fn accumulate_rows(
    row: &mut [f32],
    rows: usize,
    scales: Option<&[f32]>,
    weights: &[f32],
    stride: usize,
    acc: &mut [f32],
    mut decode: impl FnMut(usize, &mut [f32]),
    axpy: impl Fn(f32, &[f32], &mut [f32]),
) {
    let n_qh = acc.len() / row.len();
    for j in 0..rows {
        if !any_weight(weights, stride, n_qh, j) {
            continue;
        }
        decode(j, row);
        let scale = scales.map_or(1.0, |s| s[j]);
        for (qh, acc_row) in acc.chunks_exact_mut(row.len()).enumerate() {
            let w = weights[qh * stride + j] * scale;
            if w != 0.0 {
                axpy(w, row, acc_row);
            }
        }
    }
}

/// [`accumulate_rows`] over fp16 rows `[rows][d]`, each widened by the ISA's `convert`.
#[inline(always)]
pub(crate) fn accumulate_f16_rows(
    values: &[f16],
    d: usize,
    weights: &[f32],
    stride: usize,
    acc: &mut [f32],
    convert: impl Fn(&[f16], &mut [f32]),
    axpy: impl Fn(f32, &[f32], &mut [f32]),
) {
    let mut row = RowBuf::new();
    let decode = |j: usize, row: &mut [f32]| convert(&values[j * d..(j + 1) * d], row);
    let rows = values.len() / d;
    accumulate_rows(
        &mut row.0[..d],
        rows,
        None,
        weights,
        stride,
        acc,
        decode,
        axpy,
    );
}

/// [`accumulate_rows`] over code rows, row `j` decoded by `decode(j · layout.bytes(), row)`
/// (its byte offset in `r.codes`) and weighted by its scale.
#[inline(always)]
pub(crate) fn accumulate_code_rows(
    r: CodedRows<'_>,
    weights: &[f32],
    stride: usize,
    acc: &mut [f32],
    decode: impl Fn(usize, &mut [f32]),
    axpy: impl Fn(f32, &[f32], &mut [f32]),
) {
    let mut row = RowBuf::new();
    let bytes = r.layout.bytes();
    let decode = |j: usize, row: &mut [f32]| decode(j * bytes, row);
    let (row, rows) = (&mut row.0[..r.layout.d], r.scales.len());
    accumulate_rows(
        row,
        rows,
        Some(r.scales),
        weights,
        stride,
        acc,
        decode,
        axpy,
    );
}

/// # Safety
/// `isa` must run on this CPU; shapes as checked by [`accumulate_f16`].
pub(crate) unsafe fn accumulate_f16_on(
    isa: Isa,
    values: &[f16],
    d: usize,
    weights: &[f32],
    stride: usize,
    acc: &mut [f32],
) {
    dispatch!(isa, accumulate_f16(values, d, weights, stride, acc))
}

/// # Safety
/// `isa` must run on this CPU; shapes as checked by [`accumulate_codes`].
pub(crate) unsafe fn accumulate_codes_on(
    isa: Isa,
    r: CodedRows<'_>,
    weights: &[f32],
    stride: usize,
    acc: &mut [f32],
) {
    dispatch!(isa, accumulate_codes(r, weights, stride, acc))
}

/// `start` plus `isa`'s sums over `block`'s first `rows` rows, cut into separately stored pages
/// of `page_rows` rows and passed as one run, as the attention loop passes a tile.
///
/// # Safety
/// `isa` runs on this CPU; `block` holds `rows` rows; `weights` has `stride` columns per head
/// covering them, `start` one row of `block.layout.d` per head.
#[cfg(any(test, feature = "parity"))]
pub(crate) unsafe fn accumulate_as_pages(
    isa: Isa,
    block: CodedRows<'_>,
    rows: usize,
    page_rows: usize,
    weights: &[f32],
    stride: usize,
    start: &[f32],
) -> Vec<f32> {
    let bytes = block.layout.bytes();
    let copies: Vec<Vec<u8>> = block.codes[..rows * bytes]
        .chunks(page_rows * bytes)
        .map(<[u8]>::to_vec)
        .collect();
    let pages: Vec<&[u8]> = copies.iter().map(Vec::as_slice).collect();
    let mut paged = start.to_vec();
    // SAFETY: forwarded (caller); the pages hold the rows' codes.
    unsafe {
        accumulate_code_pages_on(
            isa,
            &pages,
            page_rows,
            block.layout,
            block.levels,
            &block.scales[..rows],
            weights,
            stride,
            &mut paged,
        )
    };
    paged
}

#[cfg(any(test, feature = "parity"))]
pub(crate) fn parity(isa: Isa) -> crate::test_util::Check {
    use crate::kv_score::{for_each_coded_block, for_each_f16_block};
    use crate::test_util::*;
    let mut rng = Rng::new(6);
    let stride = 37;
    let weights_for = |rng: &mut Rng, n_qh: usize| -> Vec<f32> {
        // Softmax-like weights in [0, 1), some exactly zero (masked), token 2 zero for all.
        (0..n_qh * stride)
            .map(|i| {
                let w = rng.uniform().abs();
                if i % stride == 2 || w < 0.2 {
                    0.0
                } else {
                    w
                }
            })
            .collect()
    };
    for_each_coded_block(&mut rng, |rng, layout, block, n_qh, rows| {
        let d = layout.d;
        let weights = weights_for(rng, n_qh);
        let mut want = random_vec(rng.next_u64(), n_qh * d);
        let mut got = want.clone();
        scalar::accumulate_codes(block, &weights, stride, &mut want);
        // SAFETY: `isa` comes from the runnable list.
        unsafe { accumulate_codes_on(isa, block, &weights, stride, &mut got) };
        // |acc| < 1, Σ_j |w·scale·level| < rows · 0.6.
        canonical(isa, &got, &want, 1.0 + 0.6 * rows as f32, &|| {
            format!(
                "accumulate_codes d={d} {}/{}x{} n_qh={n_qh} rows={rows}",
                layout.hi, layout.lo, layout.n_hi
            )
        })?;
        // The same rows as a run of separately stored pages (ragged against the 32-row
        // chunks): what one call per page gives, which is the one block's result.
        for page_rows in [5usize, 16] {
            // Both start from the block's sums and add the rows once more.
            let mut from_block = want.clone();
            scalar::accumulate_codes(block, &weights, stride, &mut from_block);
            // SAFETY: `isa` comes from the runnable list; shapes as for the block.
            let paged = unsafe {
                accumulate_as_pages(isa, block, rows, page_rows, &weights, stride, &want)
            };
            canonical(isa, &paged, &from_block, 2.0 + 1.2 * rows as f32, &|| {
                format!(
                    "accumulate_code_pages pages of {page_rows} d={d} {}/{}x{} n_qh={n_qh} rows={rows}",
                    layout.hi, layout.lo, layout.n_hi
                )
            })?;
        }
        Ok(())
    })?;
    for_each_f16_block(&mut rng, |rng, d, values, n_qh, rows| {
        let weights = weights_for(rng, n_qh);
        let mut want = random_vec(rng.next_u64(), n_qh * d);
        let mut got = want.clone();
        scalar::accumulate_f16(values, d, &weights, stride, &mut want);
        // SAFETY: `isa` comes from the runnable list.
        unsafe { accumulate_f16_on(isa, values, d, &weights, stride, &mut got) };
        canonical(isa, &got, &want, 1.0 + rows as f32, &|| {
            format!("accumulate_f16 d={d} n_qh={n_qh} rows={rows}")
        })
    })
}
