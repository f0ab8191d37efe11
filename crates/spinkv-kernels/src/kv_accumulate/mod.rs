//! Attention-weighted sums of a page of cached values, for every query head of a KV head:
//! fp16 rows, or packed codes accumulated as codebook levels (in the codec's rotated domain;
//! the caller rotates the sum back once per step).
//!
//! Shapes: `weights[qh · stride + j]` for the page's `rows` tokens; `acc` `[n_qh][d]`, added
//! to. Each value row is read and decoded once for all query heads; a token whose weights are
//! all zero (causally masked) is skipped, and so is each zero weight. Codes of at most 4 bits
//! accumulate on an integer grid ([`grid`]): every ISA returns the reference's bits. fp16 rows
//! and wider codes accumulate in f32, with tolerance `1e-5 · (|acc| + Σ_j |w_j·v_j|)` per
//! element.

crate::isa::isa_modules!(scalar, x86, quad);
pub(crate) mod grid;
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
/// narrow tiles on x86, the grid scan on NEON and SIMD128) set it up once per run instead of
/// once per page.
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
    for (_, r) in page_rows_of(pages, page_rows, layout, levels, scales) {
        check_codes(r.codes, layout, levels, r.scales.len());
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
    #[cfg(target_arch = "x86_64")]
    {
        let rows = scales.len();
        // The grid's chunks start at each page's first row: the narrow kernels chunk the run
        // itself, so they take runs only of pages that are whole chunks.
        let n_qh = acc.len() / layout.d.max(1);
        let kernel = match isa {
            Isa::Avx2 | Isa::Avx512 if page_rows.is_multiple_of(grid::CHUNK) => {
                narrow::kernel_for(isa == Isa::Avx512, layout, n_qh)
            }
            _ => None,
        };
        if let Some(kernel) = kernel {
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
                // SAFETY: AVX2 is part of both x86 ISAs (the caller vouches for `isa`), VBMI and
                // VNNI were detected; the run's pages hold its rows, its weights start at column
                // `first` (checked shapes).
                unsafe {
                    match kernel {
                        narrow::Kernel::VbmiVnni => {
                            narrow_vbmi::accumulate_pages(run, page_rows, r, weights, stride, acc)
                        }
                        narrow::Kernel::Avx2 => {
                            narrow::accumulate_pages(run, page_rows, r, weights, stride, acc)
                        }
                    }
                };
            }
            return;
        }
    }
    #[cfg(any(
        target_arch = "aarch64",
        all(target_arch = "wasm32", target_feature = "simd128")
    ))]
    if isa == crate::simd::quad::ISA && page_rows.is_multiple_of(grid::CHUNK) {
        // SAFETY: NEON or SIMD128, this build's 4-lane ISA (the caller vouches for `isa`);
        // shapes checked.
        let done = unsafe {
            quad::accumulate_pages(
                pages, page_rows, layout, levels, scales, weights, stride, acc,
            )
        };
        if done {
            return;
        }
    }
    for (first, r) in page_rows_of(pages, page_rows, layout, levels, scales) {
        // SAFETY: forwarded; the page's rows and weight columns lie inside the checked shapes.
        unsafe { accumulate_codes_on(isa, r, &weights[first..], stride, acc) };
    }
}

/// The pages of a run that hold its `scales.len()` rows, `page_rows` rows a page (the last one
/// may hold fewer): each as its first row in the run and its rows (its own scales).
pub(crate) fn page_rows_of<'a>(
    pages: &'a [&'a [u8]],
    page_rows: usize,
    layout: &'a CodeLayout,
    levels: Levels<'a>,
    scales: &'a [f32],
) -> impl Iterator<Item = (usize, CodedRows<'a>)> + 'a {
    let rows = scales.len();
    pages
        .iter()
        .take(rows.div_ceil(page_rows))
        .enumerate()
        .map(move |(p, page)| {
            let first = p * page_rows;
            let in_page = &scales[first..rows.min(first + page_rows)];
            (first, CodedRows::new(page, layout, levels, in_page))
        })
}

/// Bit `t` set when row `first + t` (of `n <= 32`) has a non-zero weight for some of the
/// `n_qh` query heads: which rows of a grid chunk a scan decodes.
#[inline(always)]
pub(crate) fn live_rows(
    weights: &[f32],
    stride: usize,
    n_qh: usize,
    first: usize,
    n: usize,
) -> u32 {
    debug_assert!(n <= 32);
    (0..n)
        .filter(|&t| any_weight(weights, stride, n_qh, first + t))
        .fold(0u32, |bits, t| bits | 1 << t)
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
/// (its byte offset in `r.codes`) and weighted by its scale; on the integer grid
/// ([`accumulate_grid_rows`]) when `grid_step` is set (the decoder then yields grid levels).
#[inline(always)]
pub(crate) fn accumulate_code_rows(
    r: CodedRows<'_>,
    grid_step: Option<f32>,
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
    if let Some(step) = grid_step {
        let grid = Grid {
            scales: r.scales,
            level_step: step,
        };
        accumulate_grid_rows(row, rows, grid, weights, stride, acc, decode, axpy);
        return;
    }
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

/// A block's row scales and its grid's level step.
#[derive(Clone, Copy)]
pub(crate) struct Grid<'a> {
    pub(crate) scales: &'a [f32],
    pub(crate) level_step: f32,
}

/// The integer-grid accumulation every ISA's row path shares: per 32-row chunk, each query
/// head's weights (times the scales) are put on the grid ([`grid::quantize_chunk`]), the
/// chunk's rows (decoded to grid levels by `decode(j, row)`) are summed exactly, and each
/// head's sums are added to `acc` once ([`grid::add_chunk`]).
#[allow(clippy::too_many_arguments)]
#[inline(always)]
pub(crate) fn accumulate_grid_rows(
    row: &mut [f32],
    rows: usize,
    grid: Grid<'_>,
    weights: &[f32],
    stride: usize,
    acc: &mut [f32],
    mut decode: impl FnMut(usize, &mut [f32]),
    axpy: impl Fn(f32, &[f32], &mut [f32]),
) {
    let d = row.len();
    let n_qh = acc.len() / d;
    crate::scratch::with_reused(&GRID_SCRATCH, |scratch| {
        scratch.resize(n_qh * (d + grid::CHUNK + 1), 0.0);
        let (sums, rest) = scratch.split_at_mut(n_qh * d);
        let (ws, factors) = rest.split_at_mut(n_qh * grid::CHUNK);
        grid_chunks(
            row,
            rows,
            grid,
            (weights, stride),
            acc,
            (sums, ws, factors),
            (&mut decode, &axpy),
        );
    })
}

thread_local! {
    /// Per-thread scratch of [`accumulate_grid_rows`] (each head's chunk sums and grid weights),
    /// reused across calls: run once per page (wherever no tile or grid scan takes the layout).
    static GRID_SCRATCH: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// [`accumulate_grid_rows`]'s loop over chunks, with its scratch.
#[allow(clippy::type_complexity)]
#[inline(always)]
fn grid_chunks(
    row: &mut [f32],
    rows: usize,
    grid: Grid<'_>,
    (weights, stride): (&[f32], usize),
    acc: &mut [f32],
    (sums, ws, factors): (&mut [f32], &mut [f32], &mut [f32]),
    (decode, axpy): (
        &mut impl FnMut(usize, &mut [f32]),
        &impl Fn(f32, &[f32], &mut [f32]),
    ),
) {
    let d = row.len();
    let n_qh = factors.len();
    for c0 in (0..rows).step_by(grid::CHUNK) {
        let nc = (rows - c0).min(grid::CHUNK);
        crate::prefetch::pump_rows(nc);
        let live = live_rows(weights, stride, n_qh, c0, nc);
        if live == 0 {
            continue;
        }
        for (qh, (ws, factor)) in ws
            .chunks_exact_mut(grid::CHUNK)
            .zip(&mut *factors)
            .enumerate()
        {
            let (ws, w) = (&mut ws[..nc], &weights[qh * stride + c0..][..nc]);
            for ((q, w), s) in ws.iter_mut().zip(w).zip(&grid.scales[c0..c0 + nc]) {
                *q = w * s;
            }
            *factor = grid::quantize_chunk(ws, grid.level_step);
        }
        sums.fill(0.0);
        for t in (0..nc).filter(|t| live & 1 << t != 0) {
            decode(c0 + t, row);
            for (qh, sum) in sums.chunks_exact_mut(d).enumerate() {
                let q = ws[qh * grid::CHUNK + t];
                if q != 0.0 {
                    axpy(q, row, sum);
                }
            }
        }
        for ((acc, sum), &factor) in acc
            .chunks_exact_mut(d)
            .zip(sums.chunks_exact(d))
            .zip(&*factors)
        {
            grid::add_chunk(sum, factor, acc);
        }
    }
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
        // Softmax-like weights in [0, 1), some exactly zero (masked), token 2 zero for all,
        // every fifth column negated (the kernels take any sign).
        (0..n_qh * stride)
            .map(|i| {
                let w = rng.uniform().abs();
                if i % stride == 2 || w < 0.2 {
                    0.0
                } else if i % stride % 5 == 4 {
                    -w
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
        // On the integer grid every ISA returns the reference's bits; wider codes are f32.
        let on_grid = grid::applies(layout);
        let check = |got: &[f32], want: &[f32], scale: f32, what: &dyn Fn() -> String| {
            if on_grid {
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                identical(&bits(got), &bits(want), &|| format!("{} (grid)", what()))
            } else {
                canonical(isa, got, want, scale, what)
            }
        };
        // |acc| < 1, Σ_j |w·scale·level| < rows · 0.6.
        check(&got, &want, 1.0 + 0.6 * rows as f32, &|| {
            format!(
                "accumulate_codes d={d} {}/{}x{} n_qh={n_qh} rows={rows}",
                layout.hi, layout.lo, layout.n_hi
            )
        })?;
        // The same rows as a run of separately stored pages (ragged against the 32-row
        // chunks, and whole chunks): what the reference gives one call per page.
        for page_rows in [5usize, 16, 32] {
            // Both start from the block's sums and add the rows once more.
            // SAFETY: `isa` comes from the runnable list (scalar always is); shapes as for the
            // block.
            let (paged, reference) = unsafe {
                (
                    accumulate_as_pages(isa, block, rows, page_rows, &weights, stride, &want),
                    accumulate_as_pages(
                        Isa::Scalar,
                        block,
                        rows,
                        page_rows,
                        &weights,
                        stride,
                        &want,
                    ),
                )
            };
            check(&paged, &reference, 2.0 + 1.2 * rows as f32, &|| {
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
    })?;
    #[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
    if isa == Isa::Simd128 {
        quad::f16_tiles_parity()?;
    }
    Ok(())
}
