//! AVX2 scoring. Rows come in blocks of 4: each row is decoded (codes: shuffle/shift/
//! `vpermps`) or widened (fp16) once into a block buffer, then for every query head each row's
//! canonical 16-lane dot product (see `crate::canon`) runs as two 8-lane FMA chains, and a
//! transposing reduction with the canonical tree turns the 4 rows' lanes into 4 scores.

use crate::codes::avx2::RowDecoder;
use crate::codes::CodedRows;
use crate::simd::avx2::tail_mask;
use half::f16;
use std::arch::x86_64::*;
use std::mem::MaybeUninit;

/// Rows per block: 4 rows × the canonical 16 lanes (two 8-lane accumulators each) leave room
/// for the query chunk in the 16 ymm registers.
const BLOCK: usize = 4;
/// Head dims up to this take the blocked path; larger ones decode row by row.
const MAX_BLOCKED_DIM: usize = 256;

/// Canonical sums (`crate::canon::reduce16`) of 4 rows of 16 lanes (`lo[t]`, `hi[t]`), lane
/// `t` of the result for row `t`: the same tree as one row's reduction, transposed.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn transpose_sum(lo: &[__m256; BLOCK], hi: &[__m256; BLOCK]) -> __m128 {
    // Per quad and row: (x0 + x2) and (x1 + x3), then their sum; rows side by side.
    let quads = |v: &[__m256; BLOCK]| {
        let p01 = _mm256_add_ps(
            _mm256_unpacklo_ps(v[0], v[1]),
            _mm256_unpackhi_ps(v[0], v[1]),
        );
        let p23 = _mm256_add_ps(
            _mm256_unpacklo_ps(v[2], v[3]),
            _mm256_unpackhi_ps(v[2], v[3]),
        );
        let (p01, p23) = (_mm256_castps_pd(p01), _mm256_castps_pd(p23));
        let q = _mm256_add_ps(
            _mm256_castpd_ps(_mm256_unpacklo_pd(p01, p23)),
            _mm256_castpd_ps(_mm256_unpackhi_pd(p01, p23)),
        );
        // Quads 0 and 1 (or 2 and 3) of the 16 lanes.
        _mm_add_ps(_mm256_castps256_ps128(q), _mm256_extractf128_ps::<1>(q))
    };
    _mm_add_ps(quads(lo), quads(hi))
}

/// Widens fp16 row `src` (`d` halves) into `dst`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn widen_row(src: &[f16], dst: *mut f32) {
    let d = src.len();
    let mut c = 0;
    // SAFETY: full chunks stay below d; the tail goes through a local copy and a masked store.
    unsafe {
        while c + 8 <= d {
            let h = _mm_loadu_si128(src.as_ptr().add(c) as *const __m128i);
            _mm256_storeu_ps(dst.add(c), _mm256_cvtph_ps(h));
            c += 8;
        }
        if c < d {
            let mut tail = [f16::ZERO; 8];
            tail[..d - c].copy_from_slice(&src[c..]);
            let v = _mm256_cvtph_ps(_mm_loadu_si128(tail.as_ptr() as *const __m128i));
            _mm256_maskstore_ps(dst.add(c), tail_mask(d - c), v);
        }
    }
}

/// Scores of the rows `write_rows(j0, n, dst)` produces (row `t` at `dst + t·d`), for every
/// query head; `scales` multiply them.
///
/// # Safety
/// AVX2; shapes as checked by the dispatcher; `d <= MAX_BLOCKED_DIM`.
#[allow(clippy::too_many_arguments)]
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn score_blocks(
    write_rows: impl Fn(usize, usize, *mut f32),
    d: usize,
    rows: usize,
    scales: Option<&[f32]>,
    queries: &[f32],
    scores: &mut [f32],
    stride: usize,
) {
    let mut buf = MaybeUninit::<[f32; BLOCK * MAX_BLOCKED_DIM]>::uninit();
    let buf = buf.as_mut_ptr() as *mut f32;
    let zero = _mm256_setzero_ps();
    let d16 = d / 16 * 16;
    let (m_lo, m_hi) = (
        tail_mask((d - d16).min(8)),
        tail_mask((d - d16).saturating_sub(8)),
    );
    for j0 in (0..rows).step_by(BLOCK) {
        let nb = (rows - j0).min(BLOCK);
        write_rows(j0, nb, buf);
        // SAFETY: the buffer has room for BLOCK rows of d; rows past the page score 0.
        unsafe { core::ptr::write_bytes(buf.add(nb * d), 0, (BLOCK - nb) * d) };
        let mut row_scales = [1.0f32; BLOCK];
        if let Some(s) = scales {
            for (dst, &src) in row_scales.iter_mut().zip(&s[j0..j0 + nb]) {
                *dst = src;
            }
        }
        for (qh, q) in queries.chunks_exact(d).enumerate() {
            let (mut lo, mut hi) = ([zero; BLOCK], [zero; BLOCK]);
            // SAFETY (both loops): chunks stay below d in the query and every buffer row.
            unsafe {
                let mut c = 0;
                while c < d16 {
                    let (ql, qv) = (
                        _mm256_loadu_ps(q.as_ptr().add(c)),
                        _mm256_loadu_ps(q.as_ptr().add(c + 8)),
                    );
                    for t in 0..BLOCK {
                        let r = buf.add(t * d + c);
                        lo[t] = _mm256_fmadd_ps(_mm256_loadu_ps(r), ql, lo[t]);
                        hi[t] = _mm256_fmadd_ps(_mm256_loadu_ps(r.add(8)), qv, hi[t]);
                    }
                    c += 16;
                }
                if d16 < d {
                    let ql = _mm256_maskload_ps(q.as_ptr().add(d16), m_lo);
                    let qv = _mm256_maskload_ps(q.as_ptr().add(d16 + 8), m_hi);
                    for t in 0..BLOCK {
                        let r = buf.add(t * d + d16);
                        lo[t] = _mm256_fmadd_ps(_mm256_maskload_ps(r, m_lo), ql, lo[t]);
                        hi[t] = _mm256_fmadd_ps(_mm256_maskload_ps(r.add(8), m_hi), qv, hi[t]);
                    }
                }
            }
            let out = &mut scores[qh * stride + j0..qh * stride + j0 + nb];
            // SAFETY: 4-float local arrays; a whole block's 4 scores lie inside `out`.
            unsafe {
                let s = _mm_mul_ps(transpose_sum(&lo, &hi), _mm_loadu_ps(row_scales.as_ptr()));
                // A whole block stores its 4 scores at once: the copy through a local array
                // was a `memmove` call (runtime length) per block and query head, ~15 % of
                // score_f16's samples in a prefill profile (perf, decode_bench pp256 at depth
                // 512, turbo, 1 thread, AMD EPYC Zen 3, AVX2: memmove 3.0 -> 1.6 % of all
                // samples; in-process A/B B/A 1.007 and 1.032, within this VM's noise).
                if nb == BLOCK {
                    _mm_storeu_ps(out.as_mut_ptr(), s);
                } else {
                    let mut four = [0.0f32; BLOCK];
                    _mm_storeu_ps(four.as_mut_ptr(), s);
                    out.copy_from_slice(&four[..nb]);
                }
            }
        }
    }
}

/// # Safety
/// CPU must support AVX2+FMA+F16C; shapes as checked by `super::score_f16`.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn score_f16(
    keys: &[f16],
    d: usize,
    queries: &[f32],
    scores: &mut [f32],
    stride: usize,
) {
    let rows = keys.len() / d;
    if d <= MAX_BLOCKED_DIM {
        let write = |j0: usize, n: usize, dst: *mut f32| {
            for t in 0..n {
                let j = j0 + t;
                // SAFETY: same target features; row j < rows lies inside keys; buffer row t
                // has room for d floats.
                unsafe { widen_row(&keys[j * d..(j + 1) * d], dst.add(t * d)) };
            }
        };
        // SAFETY: same target features; shapes checked by the dispatcher.
        return unsafe { score_blocks(write, d, rows, None, queries, scores, stride) };
    }
    // SAFETY (both closures): same target features as this function; equal lengths.
    let convert = |x: &[f16], row: &mut [f32]| unsafe { crate::convert::avx2::f16_to_f32(x, row) };
    let dot = |q: &[f32], row: &[f32]| unsafe { crate::vec_f32::avx2::dot(q, row) };
    super::score_f16_rows(keys, d, queries, scores, stride, convert, dot);
}

/// # Safety
/// CPU must support AVX2+FMA+F16C; shapes as checked by `super::score_codes`.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn score_codes(r: CodedRows<'_>, queries: &[f32], scores: &mut [f32], stride: usize) {
    let (codes, layout, levels, scales) = (r.codes, r.layout, r.levels, r.scales);
    let (d, bytes) = (layout.d, layout.bytes());
    // SAFETY: same target features as this function; every row lies inside `codes`
    // (checked), the levels were checked against the layout.
    unsafe {
        let decoder = RowDecoder::new(layout, levels);
        if d <= MAX_BLOCKED_DIM && decoder.has_segments() {
            // The rows lie inside `codes` (checked); the buffer has room for n rows of d.
            let write = |j0: usize, n: usize, dst: *mut f32| {
                decoder.decode_rows(codes, j0 * bytes, bytes, n, dst, d)
            };
            return score_blocks(
                write,
                d,
                scales.len(),
                Some(scales),
                queries,
                scores,
                stride,
            );
        }
        let decode = |at: usize, row: &mut [f32]| decoder.decode(codes, at, levels, row);
        let dot = |q: &[f32], row: &[f32]| crate::vec_f32::avx2::dot(q, row);
        super::score_code_rows(r, queries, scores, stride, decode, dot);
    }
}
