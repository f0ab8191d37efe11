//! AVX-512 accumulation, register-tiled: up to 4 query heads × 4 groups of 16 channels of
//! accumulators stay in registers while the page's rows stream past; each row group is decoded
//! (codes) or widened (fp16) once per tile and feeds one FMA per query head.

use super::accumulate_rows;
use crate::vec_f32::avx512::axpy;
use crate::codes::avx512::RowDecoder;
use crate::codes::CodedRows;
use crate::simd::avx512::{tail_mask, Lanes};
use crate::simd::RowBuf;
use half::f16;
use std::arch::x86_64::*;
use std::mem::MaybeUninit;

/// Query heads and channel groups per register tile (16 accumulators).
const TILE_Q: usize = 4;
const TILE_G: usize = 4;

/// Up to 16 channels `first..first + n` of a row (an accumulator tile's unit).
#[derive(Clone, Copy, Debug, Default)]
struct Group {
    first: usize,
    n: usize,
}

/// A page's value rows, group by group.
trait Source {
    /// Group `group` of row `j` widened to f32 (lanes past the group may be anything finite).
    ///
    /// # Safety
    /// AVX-512; `j` is a row of the page.
    unsafe fn load(&self, j: usize, group: &Group) -> __m512;
}

struct F16Source<'a> {
    rows: &'a [f16],
    d: usize,
}

impl Source for F16Source<'_> {
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    unsafe fn load(&self, j: usize, group: &Group) -> __m512 {
        let src = self.rows[j * self.d + group.first..][..group.n].as_ptr();
        // SAFETY: the mask (or a whole group of 16) covers the group's lanes, inside the row.
        unsafe {
            if group.n == 16 {
                f16::load16(src)
            } else {
                f16::load16_masked(src, tail_mask(group.n))
            }
        }
    }
}

/// Rows already decoded to f32, `[rows][d]` (a block of code rows).
struct F32Source {
    rows: *const f32,
    d: usize,
}

impl Source for F32Source {
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    unsafe fn load(&self, j: usize, group: &Group) -> __m512 {
        // SAFETY: row j of the block holds d floats; the mask (or a whole group of 16) covers
        // the group's lanes.
        unsafe {
            let src = self.rows.add(j * self.d + group.first);
            if group.n == 16 {
                _mm512_loadu_ps(src)
            } else {
                _mm512_maskz_loadu_ps(tail_mask(group.n), src)
            }
        }
    }
}

/// Code rows decoded per block before the FMA tiles run over them.
const CODE_BLOCK: usize = 32;
/// Head dims up to this decode in blocks; larger ones row by row.
const MAX_BLOCKED_DIM: usize = 256;

/// Shapes shared by every tile of one call.
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
/// AVX-512; `acc` is `[n_qh][d]`; every group lies below `d`; the chunk's rows are rows of
/// the page.
#[allow(clippy::needless_range_loop)]
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
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
    let mut a = [[_mm512_setzero_ps(); NG]; NQ];
    // SAFETY (all accesses): weights and scales of the chunk's rows lie inside their slices
    // (checked shapes); masked accumulator lanes stay inside acc row q0 + q.
    unsafe {
        for q in 0..NQ {
            let w = page.weights.as_ptr().add((q0 + q) * page.stride + chunk.c0);
            for h in 0..chunk.n.div_ceil(16) {
                let m = tail_mask((chunk.n - 16 * h).min(16));
                let mut v = _mm512_maskz_loadu_ps(m, w.add(16 * h));
                if let Some(scales) = page.scales {
                    v = _mm512_mul_ps(
                        v,
                        _mm512_maskz_loadu_ps(m, scales.as_ptr().add(chunk.c0 + 16 * h)),
                    );
                }
                _mm512_storeu_ps(ws[q].as_mut_ptr().add(16 * h), v);
            }
        }
        for q in 0..NQ {
            for g in 0..NG {
                let at = acc.as_ptr().add((q0 + q) * d + groups[g].first);
                a[q][g] = _mm512_maskz_loadu_ps(tail_mask(groups[g].n), at);
            }
        }
        let mut live = chunk.live;
        while live != 0 {
            let t = live.trailing_zeros() as usize;
            live &= live - 1;
            let mut w = [_mm512_setzero_ps(); NQ];
            for q in 0..NQ {
                w[q] = _mm512_set1_ps(ws[q][t]);
            }
            for g in 0..NG {
                let x = src.load(chunk.c0 + t, &groups[g]);
                for q in 0..NQ {
                    a[q][g] = _mm512_fmadd_ps(w[q], x, a[q][g]);
                }
            }
        }
        for q in 0..NQ {
            for g in 0..NG {
                let at = acc.as_mut_ptr().add((q0 + q) * d + groups[g].first);
                _mm512_mask_storeu_ps(at, tail_mask(groups[g].n), a[q][g]);
            }
        }
    }
}

/// Every tile of a page.
///
/// # Safety
/// AVX-512; shapes as checked by the dispatcher.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
unsafe fn accumulate_tiled<S: Source>(src: &S, page: &Page<'_>, groups: &[Group], acc: &mut [f32]) {
    for c0 in (0..page.rows).step_by(32) {
        let nc = (page.rows - c0).min(32);
        // SAFETY: the chunk's weights lie inside `weights` (checked shapes).
        let live = unsafe {
            let mut live = 0u32;
            for qh in 0..page.n_qh {
                let w = page.weights.as_ptr().add(qh * page.stride + c0);
                for h in 0..nc.div_ceil(16) {
                    let m = tail_mask((nc - 16 * h).min(16));
                    let v = _mm512_maskz_loadu_ps(m, w.add(16 * h));
                    let nonzero = _mm512_cmp_ps_mask::<_CMP_NEQ_UQ>(v, _mm512_setzero_ps()) & m;
                    live |= (nonzero as u32) << (16 * h);
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
                        (4, 4) => tile::<S, 4, 4>(src, page, chunk, gt, q0, acc),
                        (4, 3) => tile::<S, 4, 3>(src, page, chunk, gt, q0, acc),
                        (4, 2) => tile::<S, 4, 2>(src, page, chunk, gt, q0, acc),
                        (4, _) => tile::<S, 4, 1>(src, page, chunk, gt, q0, acc),
                        (3, 4) => tile::<S, 3, 4>(src, page, chunk, gt, q0, acc),
                        (3, 3) => tile::<S, 3, 3>(src, page, chunk, gt, q0, acc),
                        (3, 2) => tile::<S, 3, 2>(src, page, chunk, gt, q0, acc),
                        (3, _) => tile::<S, 3, 1>(src, page, chunk, gt, q0, acc),
                        (2, 4) => tile::<S, 2, 4>(src, page, chunk, gt, q0, acc),
                        (2, 3) => tile::<S, 2, 3>(src, page, chunk, gt, q0, acc),
                        (2, 2) => tile::<S, 2, 2>(src, page, chunk, gt, q0, acc),
                        (2, _) => tile::<S, 2, 1>(src, page, chunk, gt, q0, acc),
                        (_, 4) => tile::<S, 1, 4>(src, page, chunk, gt, q0, acc),
                        (_, 3) => tile::<S, 1, 3>(src, page, chunk, gt, q0, acc),
                        (_, 2) => tile::<S, 1, 2>(src, page, chunk, gt, q0, acc),
                        _ => tile::<S, 1, 1>(src, page, chunk, gt, q0, acc),
                    }
                }
            }
        }
    }
}

/// The 16-channel groups of a row of `d` channels.
fn chunks16(d: usize) -> ([Group; crate::MAX_CODED_DIM / 16], usize) {
    let mut groups = [Group::default(); crate::MAX_CODED_DIM / 16];
    let n_groups = d.div_ceil(16);
    for (g, slot) in groups.iter_mut().enumerate().take(n_groups) {
        slot.first = 16 * g;
        slot.n = (d - 16 * g).min(16);
    }
    (groups, n_groups)
}

/// # Safety
/// CPU must support AVX-512 F/BW/VL (+AVX2/FMA/F16C); shapes as checked by
/// `super::accumulate_f16`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
pub unsafe fn accumulate_f16(
    values: &[f16],
    d: usize,
    weights: &[f32],
    stride: usize,
    acc: &mut [f32],
) {
    let (groups, n_groups) = chunks16(d);
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
            &groups[..n_groups],
            acc,
        )
    }
}

/// # Safety
/// CPU must support AVX-512 F/BW/VL (+AVX2/FMA/F16C); shapes as checked by
/// `super::accumulate_codes`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
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
            let (groups, n_groups) = chunks16(d);
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
