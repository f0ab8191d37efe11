//! AVX2 / AVX-512 accumulation, register-tiled: up to `TILE` query heads × `TILE` groups of
//! one register of channels each stay in registers while the page's rows stream past (AVX2:
//! 3 × 3 of the 16 ymm registers, leaving room for the weights and a row group; AVX-512: 4 × 4
//! of the 32 zmm); each row group is decoded (codes) or widened (fp16) once per tile and feeds
//! one FMA per query head.

use super::{accumulate_code_rows, any_weight};
use crate::codes::{CodedRows, DecodeRows, Decoders};
use crate::simd::x86::{on_width, Vector};
use crate::simd::Lanes;
use half::f16;
use std::mem::MaybeUninit;

crate::isa::x86_kernels! {
    fn accumulate_f16(values: &[f16], d: usize, weights: &[f32], stride: usize, acc: &mut [f32]);
    fn accumulate_codes(r: CodedRows<'_>, weights: &[f32], stride: usize, acc: &mut [f32]);
}

/// Query heads and channel groups per register tile for `n_qh` query heads.
fn tile_size<V: Vector>(n_qh: usize) -> (usize, usize) {
    if V::N == 16 {
        (4, 4)
    } else if many_heads::<V>(n_qh) {
        MANY_HEADS_TILE
    } else {
        (3, 3)
    }
}

/// The AVX2 tile of a call with at least two of its head groups (prefill): 6 heads × 2 groups,
/// against decode's 3 × 3. 192 heads × 256 rows of V3 codes, one thread, AMD EPYC Zen 3: 228,
/// 237, 230 µs with 3 × 3 tiles (and a load mask worked out every row) against 128, 122, 114.
const MANY_HEADS_TILE: (usize, usize) = (6, 2);

/// Whether an AVX2 call of `n_qh` query heads takes [`MANY_HEADS_TILE`]s.
fn many_heads<V: Vector>(n_qh: usize) -> bool {
    V::N == 8 && n_qh >= 2 * MANY_HEADS_TILE.0
}

/// Up to one register of channels `first..first + n` of a row (an accumulator tile's unit).
#[derive(Clone, Copy, Debug, Default)]
struct Group {
    first: usize,
    n: usize,
}

impl Group {
    /// Group `g` of a row of `d` channels, a register of `V` a group.
    #[inline(always)]
    fn nth<V: Vector>(d: usize, g: usize) -> Group {
        let first = V::N * g;
        Group {
            first,
            n: (d - first).min(V::N),
        }
    }
}

/// A page's value rows `[rows][d]`, widened group by group: fp16 rows of the page, or f32
/// rows of a decoded block of codes.
struct Rows<L> {
    rows: *const L,
    d: usize,
}

impl<L: Lanes> Rows<L> {
    /// Group `group` of row `j` widened to f32 (lanes past the group are 0).
    ///
    /// # Safety
    /// `V`'s features; `j` is a row of the page.
    #[inline(always)]
    unsafe fn load<V: Vector>(&self, j: usize, group: &Group) -> V {
        let src = self.rows.wrapping_add(j * self.d + group.first);
        // SAFETY: the group's lanes lie inside row j (the caller's contract); halves come in
        // whole groups without masked loads (see `accumulate_f16`).
        unsafe {
            if L::IS_F32 || V::MASKED_HALVES {
                V::widen_part(src, group.n)
            } else {
                debug_assert_eq!(group.n, V::N, "fp16 tiles take whole groups only");
                V::widen(src)
            }
        }
    }
}

/// Code rows decoded per block before the FMA tiles run over them.
const CODE_BLOCK: usize = super::grid::CHUNK;
/// Head dims up to this decode in blocks; larger ones row by row.
const MAX_BLOCKED_DIM: usize = 256;

/// Shapes shared by every tile of one call.
struct Page<'a> {
    rows: usize,
    scales: Option<&'a [f32]>,
    /// The level step when the rows hold integer-grid levels (see `super::grid`): each chunk's
    /// weights go on the grid and its sums are added to `acc` once.
    grid: Option<f32>,
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

/// Where a register tile sits: the chunk's rows × query heads from `q0` × the `n_groups`
/// groups from group `g0`, with the heads' staged weights.
#[derive(Clone, Copy)]
struct At<'a> {
    chunk: Chunk,
    g0: usize,
    n_groups: usize,
    q0: usize,
    staged: &'a Staged,
}

/// Most query heads of a tile.
const MAX_TILE: usize = 6;

/// One chunk's weights for a tile's query heads, times the rows' scales (on the grid when the
/// page's rows are), staged once for all the tiles of those heads.
struct Staged {
    ws: [[f32; 32]; MAX_TILE],
    /// What each head's chunk sums are multiplied by when added to `acc` (grid only).
    factors: [f32; MAX_TILE],
}

/// Stages `chunk`'s weights for query heads `q0..q0 + nq`.
///
/// # Safety
/// `V`'s features; the chunk's weights and scales lie inside their slices (checked shapes);
/// `nq <= MAX_TILE`.
#[inline(always)]
unsafe fn stage<V: Vector>(page: &Page<'_>, chunk: Chunk, q0: usize, nq: usize) -> Staged {
    let mut staged = Staged {
        ws: [[0.0f32; 32]; MAX_TILE],
        factors: [0.0; MAX_TILE],
    };
    // SAFETY: masked loads stay inside the chunk's weights and scales; stores inside `ws`.
    unsafe {
        for q in 0..nq {
            let w = page.weights.as_ptr().add((q0 + q) * page.stride + chunk.c0);
            for h in 0..chunk.n.div_ceil(V::N) {
                let m = V::mask((chunk.n - V::N * h).min(V::N));
                let mut v = V::load_masked(w.add(V::N * h), m);
                if let Some(scales) = page.scales {
                    let s = V::load_masked(scales.as_ptr().add(chunk.c0 + V::N * h), m);
                    v = V::mul(v, s);
                }
                V::store(staged.ws[q].as_mut_ptr().add(V::N * h), v);
            }
            if let Some(step) = page.grid {
                staged.factors[q] = super::grid::quantize_chunk_x86::<V>(&mut staged.ws[q], step);
            }
        }
    }
    staged
}

/// One register tile: query heads `q0..q0 + NQ` × `NG` groups from `g0`, over one chunk
/// of rows. Weights (times the rows' scales) are staged per chunk, so a row costs `NQ`
/// broadcasts, `NG` loads and `NQ·NG` FMAs.
///
/// # Safety
/// `V`'s features; `acc` is `[n_qh][d]`; every group lies below `d`; the chunk's rows are rows
/// of the page.
#[allow(clippy::needless_range_loop)]
#[inline(always)]
unsafe fn tile<V: Vector, L: Lanes, const NQ: usize, const NG: usize>(
    src: &Rows<L>,
    page: &Page<'_>,
    at: At<'_>,
    acc: &mut [f32],
) {
    let (d, chunk, q0) = (page.d, at.chunk, at.q0);
    let groups: [Group; NG] = core::array::from_fn(|g| Group::nth::<V>(d, at.g0 + g));
    let (ws, factors) = (&at.staged.ws, &at.staged.factors);
    // SAFETY (all accesses): masked accumulator lanes stay inside acc row q0 + q.
    unsafe {
        let mut a = [[V::zero(); NG]; NQ];
        if page.grid.is_none() {
            for q in 0..NQ {
                for g in 0..NG {
                    let at = acc.as_ptr().add((q0 + q) * d + groups[g].first);
                    a[q][g] = V::load_masked(at, V::mask(groups[g].n));
                }
            }
        }
        // The row's groups first, then one weight broadcast at a time: a tile of 6 heads × 2
        // groups keeps 12 accumulators, 2 groups and a weight in the 16 ymm. (A macro, not a
        // closure: closures do not inherit the kernel's target features.)
        macro_rules! add_row {
            ($t:expr, $x:expr) => {{
                let (t, x): (usize, [V; NG]) = ($t, $x);
                for q in 0..NQ {
                    let w = V::splat(ws[q][t]);
                    for g in 0..NG {
                        a[q][g] = V::fma(w, x[g], a[q][g]);
                    }
                }
            }};
        }
        let whole_groups = groups.iter().all(|g| g.n == V::N);
        if whole_groups && chunk.live == u32::MAX >> (32 - chunk.n) {
            // Every row live (a prefill's history): a straight loop, plain loads.
            for t in 0..chunk.n {
                let row = src.rows.add((chunk.c0 + t) * d);
                let mut x = [V::zero(); NG];
                for g in 0..NG {
                    x[g] = V::widen(row.add(groups[g].first));
                }
                add_row!(t, x);
            }
        } else {
            let mut live = chunk.live;
            while live != 0 {
                let t = live.trailing_zeros() as usize;
                live &= live - 1;
                let mut x = [V::zero(); NG];
                for g in 0..NG {
                    x[g] = src.load(chunk.c0 + t, &groups[g]);
                }
                add_row!(t, x);
            }
        }
        for q in 0..NQ {
            for g in 0..NG {
                let at = acc.as_mut_ptr().add((q0 + q) * d + groups[g].first);
                let n = groups[g].n;
                let sum = match page.grid {
                    // The chunk's exact sums, added once: a multiply, then an add.
                    Some(_) => V::add(
                        V::load_part(at, n),
                        V::mul(a[q][g], V::splat(factors[q])),
                    ),
                    None => a[q][g],
                };
                V::store_part(at, n, sum);
            }
        }
    }
}

/// The tile of `NQ` query heads × `at.n_groups` groups (each 1..=4).
///
/// # Safety
/// As [`tile`].
#[inline(always)]
unsafe fn tile_of<V: Vector, L: Lanes, const NQ: usize>(
    src: &Rows<L>,
    page: &Page<'_>,
    at: At<'_>,
    acc: &mut [f32],
) {
    // SAFETY: forwarded from the caller.
    unsafe {
        match at.n_groups {
            4 => tile::<V, L, NQ, 4>(src, page, at, acc),
            3 => tile::<V, L, NQ, 3>(src, page, at, acc),
            2 => tile::<V, L, NQ, 2>(src, page, at, acc),
            _ => tile::<V, L, NQ, 1>(src, page, at, acc),
        }
    }
}

/// Bit `t` set when row `c0 + t` (`t < nc`) has a non-zero weight for some query head.
///
/// # Safety
/// `V`'s features; the rows' weights lie inside `weights`.
#[inline(always)]
unsafe fn live_rows<V: Vector>(page: &Page<'_>, c0: usize, nc: usize) -> u32 {
    let mut live = 0u32;
    // SAFETY: masked loads stay inside each head's weights of the chunk (caller).
    unsafe {
        for qh in 0..page.n_qh {
            let w = page.weights.as_ptr().add(qh * page.stride + c0);
            for h in 0..nc.div_ceil(V::N) {
                let n = (nc - V::N * h).min(V::N);
                let v = V::load_masked(w.add(V::N * h), V::mask(n));
                live |= V::nonzero_bits(v, n) << (V::N * h);
            }
        }
    }
    live
}

/// Every tile of a page.
///
/// # Safety
/// `V`'s features; shapes as checked by the dispatcher.
#[inline(always)]
unsafe fn accumulate_tiled<V: Vector, L: Lanes>(
    src: &Rows<L>,
    page: &Page<'_>,
    n_groups: usize,
    acc: &mut [f32],
) {
    let tile_q = tile_size::<V>(page.n_qh).0;
    for c0 in (0..page.rows).step_by(32) {
        let nc = (page.rows - c0).min(32);
        // SAFETY: the chunk's weights lie inside `weights` (checked shapes).
        let live = unsafe { live_rows::<V>(page, c0, nc) };
        if live == 0 {
            continue;
        }
        let chunk = Chunk { c0, n: nc, live };
        for q0 in (0..page.n_qh).step_by(tile_q) {
            let nq = (page.n_qh - q0).min(tile_q);
            // SAFETY: `V`'s features; the chunk lies inside the page (checked shapes).
            let staged = unsafe { stage::<V>(page, chunk, q0, nq) };
            // SAFETY: `V`'s features; the chunk's heads lie inside acc.
            unsafe { staged_tiles::<V, L>(src, page, chunk, (q0, nq), &staged, n_groups, acc) };
        }
    }
}

/// The tiles of one chunk's staged query heads `heads.0..heads.0 + heads.1`, every group.
///
/// # Safety
/// `V`'s features; the heads and groups lie inside `acc`; the chunk's rows inside the page.
#[inline(always)]
unsafe fn staged_tiles<V: Vector, L: Lanes>(
    src: &Rows<L>,
    page: &Page<'_>,
    chunk: Chunk,
    (q0, nq): (usize, usize),
    staged: &Staged,
    n_groups: usize,
    acc: &mut [f32],
) {
    let tile_g = tile_size::<V>(page.n_qh).1;
    for g0 in (0..n_groups).step_by(tile_g) {
        let at = At {
            chunk,
            g0,
            n_groups: (n_groups - g0).min(tile_g),
            q0,
            staged,
        };
        // SAFETY: `V`'s features; the tile's heads and groups are inside acc (caller).
        unsafe {
            match nq {
                6 => tile_of::<V, L, 6>(src, page, at, acc),
                5 => tile_of::<V, L, 5>(src, page, at, acc),
                4 => tile_of::<V, L, 4>(src, page, at, acc),
                3 => tile_of::<V, L, 3>(src, page, at, acc),
                2 => tile_of::<V, L, 2>(src, page, at, acc),
                _ => tile_of::<V, L, 1>(src, page, at, acc),
            }
        }
    }
}

/// # Safety
/// `V`'s features; shapes as checked by `super::accumulate_f16`.
#[inline(always)]
unsafe fn accumulate_f16<V: Vector>(
    values: &[f16],
    d: usize,
    weights: &[f32],
    stride: usize,
    acc: &mut [f32],
) {
    // AVX-512 tiles every channel (masked loads of halves). AVX2 tiles whole groups of 8 only
    // (no masked loads of halves: a copy would be a call inside the hot loop); its last d % 8
    // channels go through scalar FMAs, which add each element in the same row order.
    let tiled = if V::MASKED_HALVES { d } else { d / V::N * V::N };
    let n_groups = tiled.div_ceil(V::N);
    let page = Page {
        rows: values.len() / d,
        scales: None,
        grid: None,
        weights,
        stride,
        n_qh: acc.len() / d,
        d,
    };
    let src = Rows {
        rows: values.as_ptr(),
        d,
    };
    // The page's lines asked for at once, as the fp16 key scan does: decode attention at depth
    // 7,680 B/A 0.983, 0.978, 0.997 in-process (turbo, 2 threads, AMD EPYC Zen 4).
    crate::prefetch::to_l1(crate::convert::half_bytes(values));
    if many_heads::<V>(page.n_qh) && page.rows <= CODE_BLOCK && d <= MAX_BLOCKED_DIM {
        // Many heads (prefill): the page's rows widened once into a buffer, not once per
        // register tile of 6 heads: prefill of 256 tokens after 512 B/A 1.029, 1.014, 1.021
        // in-process (turbo, 2 threads, AMD EPYC Zen 3).
        let mut buf = MaybeUninit::<[f32; CODE_BLOCK * MAX_BLOCKED_DIM]>::uninit();
        let buf = buf.as_mut_ptr() as *mut f32;
        // SAFETY: `V`'s features; the page's rows × `d` fit the buffer; the tiles read whole
        // groups below `tiled` only.
        unsafe {
            for j in 0..page.rows {
                for c in (0..tiled).step_by(V::N) {
                    let at = j * d + c;
                    V::store(buf.add(at), V::widen(values.as_ptr().add(at)));
                }
            }
            let widened = Rows {
                rows: buf as *const f32,
                d,
            };
            accumulate_tiled::<V, f32>(&widened, &page, n_groups, acc);
        }
    } else {
        // SAFETY: `V`'s features; shapes checked by the dispatcher.
        unsafe { accumulate_tiled::<V, f16>(&src, &page, n_groups, acc) };
    }
    for c in tiled..d {
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
/// `V`'s features; shapes as checked by `super::accumulate_codes`.
#[inline(always)]
unsafe fn accumulate_codes<V: Decoders>(
    r: CodedRows<'_>,
    weights: &[f32],
    stride: usize,
    acc: &mut [f32],
) {
    use super::narrow::{kernel_for, Kernel};
    // 16 lanes: this is the AVX-512 entry point.
    if let Some(kernel) = kernel_for(V::N == 16, r.layout, acc.len() / r.layout.d) {
        // SAFETY: AVX2 is part of both x86 ISAs' features, VBMI and VNNI were detected;
        // shapes checked by the dispatcher.
        unsafe {
            match kernel {
                Kernel::VbmiVnni => super::narrow_vbmi::accumulate(r, weights, stride, acc),
                Kernel::Avx2 => super::narrow::accumulate(r, weights, stride, acc),
            }
        };
        return;
    }
    let (d, bytes) = (r.layout.d, r.layout.bytes());
    let grid = super::grid::GridLevels::new(r.layout, r.levels);
    let levels = grid.as_ref().map_or(r.levels, super::grid::GridLevels::levels);
    let step = grid.as_ref().map(|g| g.step);
    let decoder = V::Decoder::new(r.layout, levels);
    // SAFETY: `V`'s features; every row lies inside `codes` (checked), the levels were checked
    // against the layout.
    unsafe {
        if decoder.has_segments() && d <= MAX_BLOCKED_DIM {
            let n_groups = d.div_ceil(V::N);
            let mut buf = MaybeUninit::<[f32; CODE_BLOCK * MAX_BLOCKED_DIM]>::uninit();
            let buf = buf.as_mut_ptr() as *mut f32;
            let rows = r.scales.len();
            for j0 in (0..rows).step_by(CODE_BLOCK) {
                let nb = (rows - j0).min(CODE_BLOCK);
                // Decode the block once; every tile then reads it from L1.
                decoder.decode_rows(r.codes, j0 * bytes, bytes, nb, buf, d);
                let page = Page {
                    rows: nb,
                    scales: Some(&r.scales[j0..j0 + nb]),
                    grid: step,
                    weights: &weights[j0..],
                    stride,
                    n_qh: acc.len() / d,
                    d,
                };
                let src = Rows { rows: buf as *const f32, d };
                if quads::applies::<V>(&page) {
                    quads::accumulate::<V>(&src, &page, n_groups, acc);
                } else {
                    accumulate_tiled::<V, f32>(&src, &page, n_groups, acc);
                }
            }
            return;
        }
        let decode = |at: usize, row: &mut [f32]| decoder.decode(r.codes, at, levels, row);
        let axpy = |w: f32, x: &[f32], y: &mut [f32]| on_width!(V, vec_f32::axpy(w, x, y));
        accumulate_code_rows(r, step, weights, stride, acc, decode, axpy);
    }
}

/// AVX2 prefill (many query heads) on the integer grid: four rows a multiply-add.
///
/// A chunk's grid levels are integers `|ℓ| ≤ 127` and its grid weights integers `0 ≤ q ≤ 127`
/// (a softmax weight times a token scale is never negative), so `vpmaddubsw` (unsigned weight
/// bytes times signed level bytes, two rows summed into 16 bits: at most 2 · 127 · 127, no
/// saturation) and `vpmaddwd` by ones sum four rows' products per channel exactly in 32 bits:
/// two instructions on the multiply pipes per 4 rows × 8 channels, where the f32 tile takes
/// four FMAs. The chunk's sums are the same integers, added to `acc` by the same multiply and
/// add, so the bits are the f32 tile's. A chunk with a negative (or NaN) weight takes the f32
/// tile.
mod quads {
    use super::{stage, staged_tiles, Chunk, Page, Rows, Staged, Vector, MAX_TILE};
    use std::arch::x86_64::*;

    /// Rows summed by one `vpmaddubsw` + `vpmaddwd`.
    const QUAD: usize = 4;
    /// Channels of a tile: 4 registers of 8 (i32 sums), for 2 heads, in the 16 ymm.
    const TILE_CHANNELS: usize = 32;
    /// Query heads per tile.
    const TILE_HEADS: usize = 2;
    const MAX_D: usize = super::MAX_BLOCKED_DIM;
    const CHUNK: usize = super::CODE_BLOCK;

    /// Whether a block of this page takes the quad path: AVX2 (8 lanes), grid levels, many
    /// heads, whole tiles of channels.
    pub(super) fn applies<V: Vector>(page: &Page<'_>) -> bool {
        super::many_heads::<V>(page.n_qh)
            && page.grid.is_some()
            && page.d.is_multiple_of(TILE_CHANNELS)
            && page.d <= MAX_D
    }

    /// As `super::accumulate_tiled`, chunk by chunk, with the quad tiles.
    ///
    /// # Safety
    /// AVX2; `src` holds the page's rows as grid levels; shapes as checked by the dispatcher.
    #[inline(always)]
    pub(super) unsafe fn accumulate<V: Vector>(
        src: &Rows<f32>,
        page: &Page<'_>,
        n_groups: usize,
        acc: &mut [f32],
    ) {
        let tile_q = super::tile_size::<V>(page.n_qh).0;
        let mut levels = [0u8; CHUNK * MAX_D];
        for c0 in (0..page.rows).step_by(CHUNK) {
            let nc = (page.rows - c0).min(CHUNK);
            // SAFETY: the chunk's weights lie inside `weights` (checked shapes).
            let live = unsafe { super::live_rows::<V>(page, c0, nc) };
            if live == 0 {
                continue;
            }
            let chunk = Chunk { c0, n: nc, live };
            // SAFETY: the chunk's rows lie inside `src`; AVX2 (caller).
            unsafe { interleave(src.rows.add(c0 * page.d), nc, page.d, &mut levels) };
            for q0 in (0..page.n_qh).step_by(tile_q) {
                let nq = (page.n_qh - q0).min(tile_q);
                // SAFETY: as `accumulate_tiled`.
                let staged = unsafe { stage::<V>(page, chunk, q0, nq) };
                let at = (q0, nq);
                // SAFETY: AVX2 (caller).
                if unsafe { any_signed(&staged, nq) } {
                    // SAFETY: as `accumulate_tiled`.
                    unsafe { staged_tiles::<V, f32>(src, page, chunk, at, &staged, n_groups, acc) };
                    continue;
                }
                // SAFETY: AVX2 (caller); `levels` holds the chunk's interleaved rows; heads
                // q0..q0 + nq lie inside acc.
                unsafe { heads(&levels, nc, page.d, &staged, at, acc) };
            }
        }
    }

    /// Whether a staged weight of the first `nq` heads is negative or NaN (those past the
    /// chunk's rows are 0).
    ///
    /// # Safety
    /// AVX2.
    #[inline(always)]
    unsafe fn any_signed(staged: &Staged, nq: usize) -> bool {
        // SAFETY: 32 staged floats a head; AVX2 (caller).
        unsafe {
            let zero = _mm256_setzero_ps();
            let mut bad = _mm256_setzero_ps();
            for w in &staged.ws[..nq] {
                for part in w.chunks_exact(8) {
                    let x = _mm256_loadu_ps(part.as_ptr());
                    // Not `x >= 0`, unordered: true for negatives and NaN.
                    bad = _mm256_or_ps(bad, _mm256_cmp_ps::<_CMP_NGE_UQ>(x, zero));
                }
            }
            _mm256_movemask_ps(bad) != 0
        }
    }

    /// `out[(p·d + c)·4 + r]`: the level of row `4p + r`, channel `c`, as a signed byte (0 for
    /// rows past `n`), from grid levels `[n][d]` as f32.
    ///
    /// # Safety
    /// AVX2; `rows` readable for `n · d` floats, `n <= CHUNK`, `d <= MAX_D`, `d % 8 == 0`.
    #[inline(always)]
    unsafe fn interleave(rows: *const f32, n: usize, d: usize, out: &mut [u8; CHUNK * MAX_D]) {
        // SAFETY: row r < n of `rows`; stores inside `out` (p < CHUNK / 4, c0 + 8 <= d).
        unsafe {
            let low_byte = _mm256_set1_epi32(0xff);
            for p in 0..n.div_ceil(QUAD) {
                for c0 in (0..d).step_by(8) {
                    let mut lanes = _mm256_setzero_si256();
                    for r in 0..QUAD.min(n - QUAD * p) {
                        let at = rows.add((QUAD * p + r) * d + c0);
                        let v = _mm256_cvtps_epi32(_mm256_loadu_ps(at));
                        let byte = _mm256_and_si256(v, low_byte);
                        let shift = _mm_cvtsi32_si128(8 * r as i32);
                        lanes = _mm256_or_si256(lanes, _mm256_sll_epi32(byte, shift));
                    }
                    let at = out.as_mut_ptr().add((p * d + c0) * QUAD);
                    _mm256_storeu_si256(at as *mut __m256i, lanes);
                }
            }
        }
    }

    /// Heads `q0..q0 + nq` of one chunk, `TILE_HEADS` × `TILE_CHANNELS` at a time.
    ///
    /// # Safety
    /// AVX2; `levels` written by `interleave` for `n` rows of `d` channels; `acc` is
    /// `[n_qh][d]` with heads `q0..q0 + nq` inside; the staged weights non-negative grid
    /// integers.
    #[inline(always)]
    #[allow(clippy::needless_range_loop)]
    unsafe fn heads(
        levels: &[u8; CHUNK * MAX_D],
        n: usize,
        d: usize,
        staged: &Staged,
        (q0, nq): (usize, usize),
        acc: &mut [f32],
    ) {
        let quads = n.div_ceil(QUAD);
        // Each head's weights as bytes in row order, four rows a 32-bit word (the staged
        // weights are 0 past `n`).
        let mut words = [[0u32; CHUNK / QUAD]; MAX_TILE];
        // SAFETY: AVX2 (caller); 32 staged floats a head, 8 words a head.
        unsafe {
            // `packs` work within 128-bit halves: this puts the 4-byte groups back in order.
            let order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
            for (q, words) in words.iter_mut().enumerate().take(nq) {
                let w = staged.ws[q].as_ptr();
                let x: [__m256i; 4] = [
                    _mm256_cvtps_epi32(_mm256_loadu_ps(w)),
                    _mm256_cvtps_epi32(_mm256_loadu_ps(w.add(8))),
                    _mm256_cvtps_epi32(_mm256_loadu_ps(w.add(16))),
                    _mm256_cvtps_epi32(_mm256_loadu_ps(w.add(24))),
                ];
                let low = _mm256_packs_epi32(x[0], x[1]);
                let high = _mm256_packs_epi32(x[2], x[3]);
                let bytes = _mm256_packus_epi16(low, high);
                let bytes = _mm256_permutevar8x32_epi32(bytes, order);
                _mm256_storeu_si256(words.as_mut_ptr() as *mut __m256i, bytes);
            }
        }
        // SAFETY: loads inside `levels` (quads · d · 4 bytes written by `interleave`); the
        // accumulator rows of heads q0..q0 + nq inside `acc` (caller).
        unsafe {
            let ones = _mm256_set1_epi16(1);
            let mut h = 0;
            while h < nq {
                let pair = (nq - h).min(TILE_HEADS);
                for c0 in (0..d).step_by(TILE_CHANNELS) {
                    let mut sums = [[_mm256_setzero_si256(); TILE_CHANNELS / 8]; TILE_HEADS];
                    for p in 0..quads {
                        let row = levels.as_ptr().add((p * d + c0) * QUAD);
                        let mut lv = [_mm256_setzero_si256(); TILE_CHANNELS / 8];
                        for (g, l) in lv.iter_mut().enumerate() {
                            *l = _mm256_loadu_si256(row.add(32 * g) as *const __m256i);
                        }
                        for (i, sums) in sums.iter_mut().enumerate().take(pair) {
                            let w = _mm256_set1_epi32(words[h + i][p] as i32);
                            for (s, l) in sums.iter_mut().zip(&lv) {
                                let two_rows = _mm256_maddubs_epi16(w, *l);
                                *s = _mm256_add_epi32(*s, _mm256_madd_epi16(two_rows, ones));
                            }
                        }
                    }
                    for (i, sums) in sums.iter().enumerate().take(pair) {
                        let q = q0 + h + i;
                        let factor = _mm256_set1_ps(staged.factors[h + i]);
                        for (g, s) in sums.iter().enumerate() {
                            let at = acc.as_mut_ptr().add(q * d + c0 + 8 * g);
                            let sum = _mm256_mul_ps(_mm256_cvtepi32_ps(*s), factor);
                            _mm256_storeu_ps(at, _mm256_add_ps(_mm256_loadu_ps(at), sum));
                        }
                    }
                }
                h += pair;
            }
        }
    }
}
