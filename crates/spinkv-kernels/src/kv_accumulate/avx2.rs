//! AVX2 accumulation, register-tiled: up to 3 query heads × 3 groups of 8 channels of
//! accumulators (9 of the 16 ymm registers, leaving room for the weights and a row group)
//! stay in registers while the page's rows stream
//! past; each row group is decoded (codes) or widened (fp16) once per tile and feeds one FMA per
//! query head.

use super::{accumulate_rows, any_weight};
use crate::vec_f32::avx2::axpy;
use crate::codes::avx2::{Group, RowDecoder};
use crate::codes::CodedRows;
use crate::simd::avx2::tail_mask;
use crate::simd::RowBuf;
use half::f16;
use std::arch::x86_64::*;
use std::mem::MaybeUninit;

const TILE_Q: usize = 3;
const TILE_G: usize = 3;

/// A page's value rows, group by group.
trait Source {
    /// Group `group` of row `j` widened to f32 (lanes past the group may be anything finite).
    ///
    /// # Safety
    /// AVX2; `j` is a row of the page.
    unsafe fn load(&self, j: usize, group: &Group) -> __m256;
}

struct F16Source<'a> {
    rows: &'a [f16],
    d: usize,
}

impl Source for F16Source<'_> {
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn load(&self, j: usize, group: &Group) -> __m256 {
        debug_assert_eq!(group.n, 8, "fp16 tiles take full groups only");
        let src = self.rows[j * self.d + group.first..][..8].as_ptr();
        // SAFETY: a full group of 8 halves inside the row.
        unsafe { _mm256_cvtph_ps(_mm_loadu_si128(src as *const __m128i)) }
    }
}

/// Rows already decoded to f32, `[rows][d]` (a block of code rows).
struct F32Source {
    rows: *const f32,
    d: usize,
}

impl Source for F32Source {
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn load(&self, j: usize, group: &Group) -> __m256 {
        // SAFETY: row j of the block holds d floats; the mask covers the group's lanes.
        unsafe { _mm256_maskload_ps(self.rows.add(j * self.d + group.first), tail_mask(group.n)) }
    }
}

/// Code rows decoded per block before the FMA tiles run over them.
const CODE_BLOCK: usize = 32;
/// Head dims up to this decode in blocks; larger ones row by row.
const MAX_BLOCKED_DIM: usize = 256;

struct Page<'a> {
    rows: usize,
    scales: Option<&'a [f32]>,
    weights: &'a [f32],
    stride: usize,
    n_qh: usize,
    d: usize,
}

/// Rows `c0..c0 + n` (`n <= 32`) of a page; bit `t` of `live` set when row `c0 + t` has a
/// non-zero weight for some query head.
#[derive(Clone, Copy)]
struct Chunk {
    c0: usize,
    n: usize,
    live: u32,
}

/// One register tile: query heads `q0..q0 + NQ` × the `NG` groups in `groups`, over one chunk
/// of rows. Weights (times the rows' scales) are staged per chunk, so a row costs `NQ`
/// broadcasts, `NG` loads and `NQ·NG` FMAs.
///
/// # Safety
/// AVX2; `acc` is `[n_qh][d]`; every group lies below `d`; the chunk's rows are rows of
/// the page.
#[allow(clippy::needless_range_loop)]
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn tile<S: Source, const NQ: usize, const NG: usize>(
    src: &S,
    page: &Page<'_>,
    chunk: Chunk,
    groups: &[Group],
    q0: usize,
    acc: &mut [f32],
) {
    let d = page.d;
    let mut ws = [[0.0f32; 32]; NQ];
    let mut a = [[_mm256_setzero_ps(); NG]; NQ];
    // SAFETY (all accesses): weights and scales of the chunk's rows lie inside their slices
    // (checked shapes); masked accumulator lanes stay inside acc row q0 + q.
    unsafe {
        for q in 0..NQ {
            let w = page.weights.as_ptr().add((q0 + q) * page.stride + chunk.c0);
            for h in 0..chunk.n.div_ceil(8) {
                let m = tail_mask((chunk.n - 8 * h).min(8));
                let mut v = _mm256_maskload_ps(w.add(8 * h), m);
                if let Some(scales) = page.scales {
                    v = _mm256_mul_ps(
                        v,
                        _mm256_maskload_ps(scales.as_ptr().add(chunk.c0 + 8 * h), m),
                    );
                }
                _mm256_storeu_ps(ws[q].as_mut_ptr().add(8 * h), v);
            }
        }
        for q in 0..NQ {
            for g in 0..NG {
                let at = acc.as_ptr().add((q0 + q) * d + groups[g].first);
                a[q][g] = _mm256_maskload_ps(at, tail_mask(groups[g].n));
            }
        }
        let mut live = chunk.live;
        while live != 0 {
            let t = live.trailing_zeros() as usize;
            live &= live - 1;
            let mut w = [_mm256_setzero_ps(); NQ];
            for q in 0..NQ {
                w[q] = _mm256_set1_ps(ws[q][t]);
            }
            for g in 0..NG {
                let x = src.load(chunk.c0 + t, &groups[g]);
                for q in 0..NQ {
                    a[q][g] = _mm256_fmadd_ps(w[q], x, a[q][g]);
                }
            }
        }
        for q in 0..NQ {
            for g in 0..NG {
                let at = acc.as_mut_ptr().add((q0 + q) * d + groups[g].first);
                _mm256_maskstore_ps(at, tail_mask(groups[g].n), a[q][g]);
            }
        }
    }
}

/// Every tile of a page.
///
/// # Safety
/// AVX2; shapes as checked by the dispatcher.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn accumulate_tiled<S: Source>(src: &S, page: &Page<'_>, groups: &[Group], acc: &mut [f32]) {
    for c0 in (0..page.rows).step_by(32) {
        let nc = (page.rows - c0).min(32);
        // SAFETY: the chunk's weights lie inside `weights` (checked shapes).
        let live = unsafe {
            let mut live = 0u32;
            for qh in 0..page.n_qh {
                let w = page.weights.as_ptr().add(qh * page.stride + c0);
                for h in 0..nc.div_ceil(8) {
                    let n = (nc - 8 * h).min(8);
                    let v = _mm256_maskload_ps(w.add(8 * h), tail_mask(n));
                    let nonzero = _mm256_cmp_ps::<_CMP_NEQ_UQ>(v, _mm256_setzero_ps());
                    let bits = _mm256_movemask_ps(nonzero) as u32 & ((1u32 << n) - 1);
                    live |= bits << (8 * h);
                }
            }
            live
        };
        if live == 0 {
            continue;
        }
        let chunk = Chunk { c0, n: nc, live };
        for gt in groups.chunks(TILE_G) {
            for q0 in (0..page.n_qh).step_by(TILE_Q) {
                let nq = (page.n_qh - q0).min(TILE_Q);
                // SAFETY: same target features; the tile's heads and groups are inside acc.
                unsafe {
                    match (nq, gt.len()) {
                        (3, 3) => tile::<S, 3, 3>(src, page, chunk, gt, q0, acc),
                        (3, 2) => tile::<S, 3, 2>(src, page, chunk, gt, q0, acc),
                        (3, _) => tile::<S, 3, 1>(src, page, chunk, gt, q0, acc),
                        (2, 3) => tile::<S, 2, 3>(src, page, chunk, gt, q0, acc),
                        (2, 2) => tile::<S, 2, 2>(src, page, chunk, gt, q0, acc),
                        (2, _) => tile::<S, 2, 1>(src, page, chunk, gt, q0, acc),
                        (_, 3) => tile::<S, 1, 3>(src, page, chunk, gt, q0, acc),
                        (_, 2) => tile::<S, 1, 2>(src, page, chunk, gt, q0, acc),
                        _ => tile::<S, 1, 1>(src, page, chunk, gt, q0, acc),
                    }
                }
            }
        }
    }
}

/// The 8-channel groups of a row of `d` channels, in a fixed-size list.
fn f16_groups(d: usize, out: &mut [Group; crate::MAX_CODED_DIM / 8]) -> usize {
    let n = d.div_ceil(8);
    for (g, slot) in out.iter_mut().enumerate().take(n) {
        *slot = Group {
            first: 8 * g,
            n: (d - 8 * g).min(8),
        };
    }
    n
}

/// # Safety
/// CPU must support AVX2+FMA+F16C; shapes as checked by `super::accumulate_f16`.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn accumulate_f16(
    values: &[f16],
    d: usize,
    weights: &[f32],
    stride: usize,
    acc: &mut [f32],
) {
    // Full groups of 8 channels go through the tiles; the last d % 8 channels (no partial
    // vector loads of halves: a copy would be a call inside the hot loop) through scalar FMAs,
    // which add each element in the same row order.
    let mut groups = [Group::default(); crate::MAX_CODED_DIM / 8];
    let n_full = d / 8;
    f16_groups(n_full * 8, &mut groups);
    let page = Page {
        rows: values.len() / d,
        scales: None,
        weights,
        stride,
        n_qh: acc.len() / d,
        d,
    };
    // SAFETY: same target features; shapes checked by the dispatcher.
    unsafe {
        accumulate_tiled(
            &F16Source { rows: values, d },
            &page,
            &groups[..n_full],
            acc,
        )
    };
    for c in n_full * 8..d {
        for j in 0..page.rows {
            if !any_weight(weights, stride, page.n_qh, j) {
                continue;
            }
            let x = values[j * d + c].to_f32();
            for qh in 0..page.n_qh {
                let a = &mut acc[qh * d + c];
                *a = weights[qh * stride + j].mul_add(x, *a);
            }
        }
    }
}

/// # Safety
/// CPU must support AVX2+FMA+F16C; shapes as checked by `super::accumulate_codes`.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn accumulate_codes(
    r: CodedRows<'_>,
    weights: &[f32],
    stride: usize,
    acc: &mut [f32],
) {
    let (codes, layout, levels, scales) = (r.codes, r.layout, r.levels, r.scales);
    let (d, bytes) = (layout.d, layout.bytes());
    let n_qh = acc.len() / d;
    // SAFETY: same target features as this function; every row lies inside `codes`
    // (checked), the levels were checked against the layout.
    unsafe {
        let decoder = RowDecoder::new(layout, levels);
        if decoder.has_segments() && d <= MAX_BLOCKED_DIM {
            let mut groups = [Group::default(); crate::MAX_CODED_DIM / 8];
            let n_groups = f16_groups(d, &mut groups);
            let mut buf = MaybeUninit::<[f32; CODE_BLOCK * MAX_BLOCKED_DIM]>::uninit();
            let buf = buf.as_mut_ptr() as *mut f32;
            let rows = scales.len();
            for j0 in (0..rows).step_by(CODE_BLOCK) {
                let nb = (rows - j0).min(CODE_BLOCK);
                // Decode the block once; every tile then reads it from L1.
                decoder.decode_rows(codes, j0 * bytes, bytes, nb, buf, d);
                let page = Page {
                    rows: nb,
                    scales: Some(&scales[j0..j0 + nb]),
                    weights: &weights[j0..],
                    stride,
                    n_qh,
                    d,
                };
                accumulate_tiled(&F32Source { rows: buf, d }, &page, &groups[..n_groups], acc);
            }
            return;
        }
        let mut row = RowBuf::new();
        let decode = |j: usize, row: &mut [f32]| decoder.decode(codes, j * bytes, levels, row);
        let rows = scales.len();
        let row = &mut row.0[..d];
        accumulate_rows(row, rows, Some(scales), weights, stride, acc, decode, |w, x, y| axpy(w, x, y));
    }
}
