//! AVX-512 scoring. Rows come in blocks of 16: each row is decoded (codes: shuffle/shift/
//! `vpermps`) or widened (fp16) once into a block buffer, then for every query head the 16 rows'
//! dot products run as 16 independent FMA chains whose results a transposing reduction
//! (unpack / shuffle / add, ~3 instructions per row) turns into one vector of 16 scores.

use crate::codes::avx512::RowDecoder;
use crate::canon::LANES;
use crate::codes::CodedRows;
use crate::simd::avx512::{tail_mask, Lanes};
use half::f16;
use std::arch::x86_64::*;
use std::mem::MaybeUninit;

/// Rows per block (one score vector).
const BLOCK: usize = 16;
/// Head dims up to this take the blocked path; larger ones decode row by row.
const MAX_BLOCKED_DIM: usize = 256;

/// A page's rows, a block at a time.
pub(crate) trait Rows {
    /// Writes rows `j0..j0 + n` to `dst` (row `t` at `dst + t·d`, `d` floats each).
    ///
    /// # Safety
    /// AVX-512; the rows are rows of the page; `dst` valid for `n·d` floats.
    unsafe fn write_rows(&self, j0: usize, n: usize, dst: *mut f32);
}

/// fp16 rows, `[rows][d]`.
pub(crate) struct F16Rows<'a> {
    pub(crate) rows: &'a [f16],
    pub(crate) d: usize,
}

impl Rows for F16Rows<'_> {
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    unsafe fn write_rows(&self, j0: usize, n: usize, dst: *mut f32) {
        let d = self.d;
        let rows = &self.rows[j0 * d..(j0 + n) * d];
        // The block's lines asked for at once: converting row after row with masked loads
        // waited on each line in turn (36 % of this kernel's samples sat on the first convert).
        // In-process A/B of decode attention at depth 7,680, where the fp16 window is the part
        // scored by this: 0.939, 0.966, 0.933, 0.979 (turbo, 2 threads, AMD EPYC Zen 4).
        crate::prefetch::to_l1(crate::convert::half_bytes(rows));
        let src = rows.as_ptr();
        for t in 0..n {
            let mut c = 0;
            while c < d {
                let m = tail_mask((d - c).min(16));
                // SAFETY: masked lanes stay inside row t of the source and of `dst`.
                unsafe {
                    let v = f16::load16_masked(src.add(t * d + c), m);
                    _mm512_mask_storeu_ps(dst.add(t * d + c), m, v);
                }
                c += 16;
            }
        }
    }
}

/// Packed code rows decoded through their codebooks (a planned layout).
pub(crate) struct CodeRows<'a> {
    pub(crate) decoder: &'a RowDecoder,
    pub(crate) codes: &'a [u8],
    pub(crate) row_bytes: usize,
    pub(crate) d: usize,
}

impl Rows for CodeRows<'_> {
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    unsafe fn write_rows(&self, j0: usize, n: usize, dst: *mut f32) {
        assert!((j0 + n) * self.row_bytes <= self.codes.len());
        // SAFETY: the rows lie inside `codes` (checked); dst has room for n rows of d.
        unsafe {
            self.decoder.decode_rows(
                self.codes,
                j0 * self.row_bytes,
                self.row_bytes,
                n,
                dst,
                self.d,
            )
        };
    }
}

/// The first two rounds of the transposing reductions, for `N` (8 or 16) rows: 128-bit lane `L`
/// of result `m` holds rows `4m..4m + 4`, each summed over the row's lanes `4L..4L + 4` as
/// `crate::canon::reduce16` pairs them (results past `N / 4` are 0).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
fn lane_quads<const N: usize>(v: &[__m512; N]) -> [__m512; 4] {
    // Pairs of rows: partial sums of rows 2k, 2k+1 interleaved within each 128-bit lane.
    let mut p = [_mm512_setzero_ps(); 8];
    for (k, p) in p.iter_mut().take(N / 2).enumerate() {
        let (a, b) = (v[2 * k], v[2 * k + 1]);
        *p = _mm512_add_ps(_mm512_unpacklo_ps(a, b), _mm512_unpackhi_ps(a, b));
    }
    // Quads: each 128-bit lane holds rows 4m..4m+3, partially summed over that lane.
    let mut q = [_mm512_setzero_ps(); 4];
    for (m, q) in q.iter_mut().take(N / 4).enumerate() {
        let (a, b) = (_mm512_castps_pd(p[2 * m]), _mm512_castps_pd(p[2 * m + 1]));
        *q = _mm512_add_ps(
            _mm512_castpd_ps(_mm512_unpacklo_pd(a, b)),
            _mm512_castpd_ps(_mm512_unpackhi_pd(a, b)),
        );
    }
    q
}

/// 128-bit lanes `(a0 + a1, a2 + a3, b0 + b1, b2 + b3)`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
fn fold_lanes(a: __m512, b: __m512) -> __m512 {
    _mm512_add_ps(
        _mm512_shuffle_f32x4::<0b10_00_10_00>(a, b),
        _mm512_shuffle_f32x4::<0b11_01_11_01>(a, b),
    )
}

/// Lane `t` of the result = the sum of the 16 lanes of `v[t]`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
fn transpose_sum(v: &[__m512; 16]) -> __m512 {
    let q = lane_quads(v);
    // Sum the four 128-bit lanes, leaving rows 4m..4m+3 in lane m.
    fold_lanes(fold_lanes(q[0], q[1]), fold_lanes(q[2], q[3]))
}

/// Scores of `rows` rows for every query head; `scales` (one per row) multiply each score.
///
/// # Safety
/// AVX-512; shapes as checked by the dispatcher; `d <= MAX_BLOCKED_DIM`.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
unsafe fn score_blocks(
    source: &impl Rows,
    d: usize,
    rows: usize,
    scales: Option<&[f32]>,
    queries: &[f32],
    scores: &mut [f32],
    stride: usize,
) {
    let mut buf = MaybeUninit::<[f32; BLOCK * MAX_BLOCKED_DIM]>::uninit();
    let buf = buf.as_mut_ptr() as *mut f32;
    let zero = _mm512_setzero_ps();
    for j0 in (0..rows).step_by(BLOCK) {
        let nb = (rows - j0).min(BLOCK);
        // SAFETY: the block buffer has room for BLOCK rows of d <= MAX_BLOCKED_DIM floats.
        unsafe {
            source.write_rows(j0, nb, buf);
            // Rows past the page's end score 0 (and are not stored).
            core::ptr::write_bytes(buf.add(nb * d), 0, (BLOCK - nb) * d);
        }
        let out_mask = tail_mask(nb);

        let row_scales = match scales {
            // SAFETY: j0 + nb <= rows = scales.len().
            Some(s) => unsafe { _mm512_maskz_loadu_ps(out_mask, s.as_ptr().add(j0)) },
            None => _mm512_set1_ps(1.0),
        };
        for (qh, q) in queries.chunks_exact(d).enumerate() {
            let mut acc = [zero; BLOCK];
            let full = d / 16 * 16;
            let mut c = 0;
            // Whole groups of 16 with plain loads, which fold into the FMAs.
            while c < full {
                // SAFETY: c + 16 <= d: inside the query and every buffer row.
                unsafe {
                    let qv = _mm512_loadu_ps(q.as_ptr().add(c));
                    for (t, acc) in acc.iter_mut().enumerate() {
                        *acc = _mm512_fmadd_ps(_mm512_loadu_ps(buf.add(t * d + c)), qv, *acc);
                    }
                }
                c += 16;
            }
            if c < d {
                let m = tail_mask(d - c);
                // SAFETY: masked lanes stay below d in the query and in every buffer row.
                unsafe {
                    let qv = _mm512_maskz_loadu_ps(m, q.as_ptr().add(c));
                    for (t, acc) in acc.iter_mut().enumerate() {
                        *acc =
                            _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, buf.add(t * d + c)), qv, *acc);
                    }
                }
            }
            let s = _mm512_mul_ps(transpose_sum(&acc), row_scales);
            // SAFETY: scores holds [n_qh][stride] with j0 + nb <= rows <= stride.
            unsafe {
                _mm512_mask_storeu_ps(scores.as_mut_ptr().add(qh * stride + j0), out_mask, s)
            };
        }
    }
}

/// Rows of an fp16 tile: with [`TILE_HEADS`] heads, 24 accumulators stay in registers.
const TILE_ROWS: usize = 8;
/// Query heads of an fp16 tile.
const TILE_HEADS: usize = 3;
/// Query heads up to which the fp16 scan runs in tiles (decode: one query, its KV head's group).
/// Beyond it (prefill) the rows are widened once into the block buffer for every head, which
/// costs less than widening them again for each tile of heads.
const TILE_MAX_HEADS: usize = 8;
/// Queued lines (the attention's next tile) a tile of fp16 rows issues: 4 a row, about the
/// sealed kernels' rate for the time a row takes. Without it the fp16 scans left the queue to
/// the bursts after each scan. In-process A/B of decode attention (SmolLM2-135M F16, turbo, 2
/// threads, licence mix, AMD EPYC Zen 4): at depth 512, where half the context is fp16, 0.942,
/// 0.957, 0.945, 0.944, 0.942, 0.915, 0.933, 1.00 (A/A 1.00, 1.00, 1.059); at 7,680 median 1.002
/// over 13 runs (0.909–1.074).
const TILE_PUMP_LINES: usize = 32;

/// Lanes 0..8 of the result = the sums of the 16 lanes of `v[0..8]`, in the canonical order
/// (`crate::canon::reduce16`), as [`transpose_sum`] reduces 16 rows.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
fn transpose_sum8(v: &[__m512; TILE_ROWS]) -> __m256 {
    let q = lane_quads(v);
    let s = fold_lanes(q[0], q[1]);
    _mm512_castps512_ps256(fold_lanes(s, s))
}

/// The fp16 key scan of a few query heads (decode) in register tiles of [`TILE_ROWS`] rows ×
/// [`TILE_HEADS`] heads: each 16-half piece of a row is widened straight from the page once and
/// multiplied into every head's accumulator, and a tile's 8 sums per head come out of one
/// transposing reduction. The block-buffer scan widened a block into memory and read it back
/// once per head. `kernel_bench avx512` (3 heads, AMD EPYC Zen 4): 5.74–6.17 ns a token against
/// 10.01; in-process A/B of decode attention (SmolLM2-135M F16, turbo, 2 threads, licence mix),
/// ms a token A → B: 1.22 → 1.18, 1.30 → 1.26, 1.30 → 1.26 at depth 512, 3.63 → 3.50 and 3.93
/// → 3.78 at 7,680.
///
/// # Safety
/// AVX-512 F/BW/VL; `d` a multiple of 16; keys `[rows][d]`, queries `[n_qh][d]`, scores
/// `[n_qh][stride]` with `rows <= stride`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
unsafe fn score_f16_tiled(
    keys: &[f16],
    d: usize,
    rows: usize,
    queries: &[f32],
    scores: &mut [f32],
    stride: usize,
) {
    let n_qh = queries.len() / d;
    for j0 in (0..rows).step_by(TILE_ROWS) {
        let nb = (rows - j0).min(TILE_ROWS);
        let tile = &keys[j0 * d..(j0 + nb) * d];
        // The tile's lines asked for at once, as the block scan did (see `F16Rows`).
        crate::prefetch::to_l1(crate::convert::half_bytes(tile));
        // A short tile reads its last row again in the missing rows' places (not stored).
        let row: [*const f16; TILE_ROWS] =
            core::array::from_fn(|t| tile.as_ptr().wrapping_add(t.min(nb - 1) * d));
        let mut h0 = 0;
        while h0 < n_qh {
            let nh = (n_qh - h0).min(TILE_HEADS);
            let q = queries[h0 * d..].as_ptr();
            let out = scores[h0 * stride + j0..].as_mut_ptr();
            // SAFETY: the rows lie inside `keys`, heads h0..h0 + nh inside queries and scores,
            // and nb <= rows - j0 scores fit each head's row of `scores`.
            unsafe {
                match nh {
                    3 => f16_tile::<3>(&row, d, q, out, stride, nb),
                    2 => f16_tile::<2>(&row, d, q, out, stride, nb),
                    _ => f16_tile::<1>(&row, d, q, out, stride, nb),
                }
            }
            h0 += nh;
        }
        crate::prefetch::pump(TILE_PUMP_LINES);
    }
}

/// One tile of [`score_f16_tiled`]: `NH` heads from `q` (`[NH][d]`) against the 8 rows, the
/// first `nb` sums of head `h` stored at `out + h·stride`.
///
/// # Safety
/// As [`score_f16_tiled`]: each row pointer valid for `d` halves.
#[inline(always)]
unsafe fn f16_tile<const NH: usize>(
    row: &[*const f16; TILE_ROWS],
    d: usize,
    q: *const f32,
    out: *mut f32,
    stride: usize,
    nb: usize,
) {
    // SAFETY (all loads and stores): the caller's contract; c + 16 <= d.
    unsafe {
        let mut acc = [[_mm512_setzero_ps(); TILE_ROWS]; NH];
        for c in (0..d).step_by(LANES) {
            let qv: [__m512; NH] = core::array::from_fn(|h| _mm512_loadu_ps(q.add(h * d + c)));
            for (t, &r) in row.iter().enumerate() {
                let x = f16::load16(r.add(c));
                for h in 0..NH {
                    acc[h][t] = _mm512_fmadd_ps(x, qv[h], acc[h][t]);
                }
            }
        }
        let mask = ((1u32 << nb) - 1) as __mmask8;
        for (h, acc) in acc.iter().enumerate() {
            _mm256_mask_storeu_ps(out.add(h * stride), mask, transpose_sum8(acc));
        }
    }
}

/// # Safety
/// CPU must support AVX-512 F/BW/VL (+AVX2/FMA/F16C); shapes as checked by
/// `super::score_f16`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
pub unsafe fn score_f16(
    keys: &[f16],
    d: usize,
    queries: &[f32],
    scores: &mut [f32],
    stride: usize,
) {
    let rows = keys.len() / d;
    let n_qh = queries.len() / d;
    if d.is_multiple_of(LANES) && n_qh <= TILE_MAX_HEADS {
        // SAFETY: same target features; shapes checked by the dispatcher, d a multiple of 16.
        return unsafe { score_f16_tiled(keys, d, rows, queries, scores, stride) };
    }
    if d <= MAX_BLOCKED_DIM {
        // SAFETY: same target features; shapes checked by the dispatcher.
        return unsafe {
            score_blocks(
                &F16Rows { rows: keys, d },
                d,
                rows,
                None,
                queries,
                scores,
                stride,
            )
        };
    }
    // SAFETY (both closures): same target features as this function; equal lengths.
    let convert = |x: &[f16], row: &mut [f32]| unsafe { crate::convert::avx512::f16_to_f32(x, row) };
    let dot = |q: &[f32], row: &[f32]| unsafe { crate::vec_f32::avx512::dot(q, row) };
    super::score_f16_rows(keys, d, queries, scores, stride, convert, dot);
}

/// # Safety
/// CPU must support AVX-512 F/BW/VL (+AVX2/FMA/F16C); shapes as checked by
/// `super::score_codes`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
pub unsafe fn score_codes(r: CodedRows<'_>, queries: &[f32], scores: &mut [f32], stride: usize) {
    let (codes, layout, levels, scales) = (r.codes, r.layout, r.levels, r.scales);
    let (d, bytes) = (layout.d, layout.bytes());
    // SAFETY: same target features as this function; every row lies inside `codes`
    // (checked), the levels were checked against the layout.
    unsafe {
        let decoder = RowDecoder::new(layout, levels);
        if d <= MAX_BLOCKED_DIM && decoder.has_segments() {
            let source = CodeRows {
                decoder: &decoder,
                codes,
                row_bytes: bytes,
                d,
            };
            return score_blocks(
                &source,
                d,
                scales.len(),
                Some(scales),
                queries,
                scores,
                stride,
            );
        }
        let decode = |at: usize, row: &mut [f32]| decoder.decode(codes, at, levels, row);
        let dot = |q: &[f32], row: &[f32]| crate::vec_f32::avx512::dot(q, row);
        super::score_code_rows(r, queries, scores, stride, decode, dot);
    }
}
