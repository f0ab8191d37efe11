//! AVX2 accumulation of narrow value codes (every channel 1..=4 bits, two byte-aligned
//! segments: turbo's 3-bit values, any rate up to 4 bits), decoding straight into the
//! register tile.
//!
//! Eight codes of at most 4 bits fill at most 32 bits and start on a byte, so a group is cut
//! out of its row by one broadcast 32-bit load and one variable shift per lane; `vpermps`
//! reads only the low 3 bits of each index, so the 8-entry level table (repeated for 1- and
//! 2-bit codes) needs no mask, and 4-bit codes take a second table picked by bit 3. That is 3
//! instructions per 8 channels with two constants per segment, so the decoded row never goes
//! through memory and the tile's accumulators, weights, and constants all stay in the 16 ymm
//! registers. The arithmetic is the reference's integer grid (`super::grid`): grid weights
//! times grid levels, summed exactly in f32 over each 32-row chunk and added to `acc` once, so
//! results are bit-identical to `scalar::accumulate_codes`.

use crate::codes::{CodeLayout, CodedRows};
use crate::simd::avx2::tail_mask;
use crate::simd::x86::Vector;
use std::arch::x86_64::*;
use std::mem::MaybeUninit;

/// Largest head dim this kernel takes (its group list and row padding live on the stack).
pub(super) const MAX_DIM: usize = 256;
/// Widest code it decodes: 8 codes in one 32-bit word.
const MAX_WIDTH: u32 = 4;
/// Rows per weight-staging chunk (one bit each in a `u32` live mask): the grid's chunk.
pub(super) const CHUNK: usize = super::grid::CHUNK;
/// Query heads × channel groups per register tile: 9 accumulators, 3 decoded groups, a weight
/// broadcast and a segment's shift and tables in 16 registers.
pub(super) const TILE_Q: usize = 3;
const TILE_G: usize = 3;
/// Bytes a group's 32-bit read may run past its row's last byte.
const OVERREAD: usize = 3;
/// The most any narrow kernel's group read runs past its row (the AVX-512 tile's 64-bit read).
pub(super) const MAX_OVERREAD: usize = 7;
/// Room for the padded copy of the rows whose group reads would leave `codes`: they lie in
/// the last `bytes + overread - 1` bytes, followed by [`ZEROS`] zeros.
const PAD_BYTES: usize = MAX_DIM * MAX_WIDTH as usize / 8 + 2 * MAX_OVERREAD + 2;

/// Query heads up to which decoding per register tile beats decoding a block once into a
/// buffer (the generic path): each tile of `TILE_Q` heads decodes the rows again. Measured
/// (d 64, 3-bit, one thread, AVX2 EPYC): 3 heads 1.5x, 6 heads 1.15x, 9 heads 1.04x faster,
/// 48 heads (prefill) 1.3x slower.
pub(super) const MAX_HEADS: usize = 3 * TILE_Q;

/// Whether [`accumulate`] takes this layout and this many query heads.
pub(crate) fn applies(layout: &CodeLayout, n_qh: usize) -> bool {
    n_qh <= MAX_HEADS
        && layout.d <= MAX_DIM
        && layout.hi <= MAX_WIDTH
        && layout.lo <= MAX_WIDTH
        && layout.segments().is_some()
}

/// A narrow kernel (see [`kernel_for`]).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kernel {
    /// This module's f32 tile, up to [`MAX_HEADS`] heads.
    Avx2,
    /// `narrow_vbmi`'s four-row tile, any number of heads.
    VbmiVnni,
}

/// The narrow kernel that takes `n_qh` query heads of `layout` (`avx512`: the caller runs the
/// AVX-512 ISA), if one does.
pub(crate) fn kernel_for(avx512: bool, layout: &CodeLayout, n_qh: usize) -> Option<Kernel> {
    if avx512 && applies(layout, 1) && super::narrow_vbmi::available() {
        Some(Kernel::VbmiVnni)
    } else {
        applies(layout, n_qh).then_some(Kernel::Avx2)
    }
}

/// How one segment's codes become levels.
#[derive(Clone, Copy)]
struct Lookup {
    /// Levels of codes 0..8 (for widths below 3, the table repeated every `2^width` entries:
    /// `vpermps` reads the index's low 3 bits, the upper ones belong to the next code).
    t0: __m256,
    /// Levels of codes 8..16 (4-bit codes only).
    t1: __m256,
}

impl Lookup {
    /// # Safety
    /// AVX2; `table` holds at least `2^width` levels.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn new(width: u32, table: &[f32]) -> Self {
        let period = 1usize << width;
        let mut lo = [0.0f32; 8];
        let mut hi = [0.0f32; 8];
        for (i, slot) in lo.iter_mut().enumerate() {
            *slot = table[i & (period - 1)];
        }
        if width == 4 {
            hi.copy_from_slice(&table[8..16]);
        }
        // SAFETY: 8-float arrays.
        unsafe {
            Lookup {
                t0: _mm256_loadu_ps(lo.as_ptr()),
                t1: _mm256_loadu_ps(hi.as_ptr()),
            }
        }
    }

    /// Levels of the 8 codes of width `W` at the bottom of `word`.
    #[inline(always)]
    unsafe fn levels<const W: i32>(&self, word: i32) -> __m256 {
        // SAFETY: AVX2 (the caller's features).
        unsafe {
            // A constant shift vector: LLVM proves every count below 32 and emits a bare
            // `vpsrlvd` (a run-time one gets a clamp and a blend per use).
            let shift = _mm256_setr_epi32(0, W, 2 * W, 3 * W, 4 * W, 5 * W, 6 * W, 7 * W);
            let idx = _mm256_srlv_epi32(_mm256_set1_epi32(word), shift);
            let lo = _mm256_permutevar8x32_ps(self.t0, idx);
            if W == 4 {
                let hi = _mm256_permutevar8x32_ps(self.t1, idx);
                // Bit 3 of the code, moved to the sign bit, picks the upper table.
                _mm256_blendv_ps(lo, hi, _mm256_castsi256_ps(_mm256_slli_epi32::<28>(idx)))
            } else {
                lo
            }
        }
    }
}

/// Up to 8 channels `first..first + n` of one segment, packed from byte `byte` of a row.
#[derive(Clone, Copy, Default)]
struct Group {
    first: usize,
    n: usize,
    byte: usize,
}

/// Pages one call takes at most (each has its own padded tail copy on the stack): 256 tokens
/// of 32-token pages. Callers split longer runs.
pub(crate) const MAX_PAGES: usize = 8;

/// Where one page's code rows are read from: rows below `safe` in place, the rest from `pad`
/// (a copy followed by zeros, so every 32-bit group read stays inside a buffer).
#[derive(Clone, Copy)]
pub(super) struct PageSource {
    codes: *const u8,
    pad: *const u8,
    safe: usize,
}

/// The rows of a run of pages, `page_rows` to a page.
pub(super) struct RowSource {
    pages: [PageSource; MAX_PAGES],
    bytes: usize,
    page_rows: usize,
}

impl RowSource {
    /// Writes the addresses of rows `c0..c0 + rows.len()` into `rows`, page by page: each
    /// page's in-place rows, then its padded ones, as two straight loops (no branch per row).
    #[inline(always)]
    pub(super) fn rows_by_page(&self, c0: usize, rows: &mut [MaybeUninit<*const u8>]) {
        let (mut page, mut j) = (c0 / self.page_rows, c0 % self.page_rows);
        let mut k = 0;
        while k < rows.len() {
            let src = &self.pages[page];
            let take = (self.page_rows - j).min(rows.len() - k);
            let in_place = src.safe.saturating_sub(j).min(take);
            for (i, row) in rows[k..k + in_place].iter_mut().enumerate() {
                row.write(src.codes.wrapping_add((j + i) * self.bytes));
            }
            let padded_from = j + in_place - src.safe.min(j + in_place);
            for (i, row) in rows[k + in_place..k + take].iter_mut().enumerate() {
                row.write(src.pad.wrapping_add((padded_from + i) * self.bytes));
            }
            (k, page, j) = (k + take, page + 1, 0);
        }
    }
}

/// The weights of one chunk for query heads `q0..q0 + nq`, times the rows' scales (the
/// reference's `w · scale`).
pub(super) struct Staged {
    /// On the grid.
    pub(super) ws: [[f32; CHUNK]; TILE_Q],
    /// What each head's chunk sums are multiplied by when added to `acc`.
    pub(super) factors: [f32; TILE_Q],
    /// Where row `c0 + t` is read from.
    pub(super) rows: [*const u8; CHUNK],
    /// Bit `t`: row `c0 + t` has a non-zero weight for one of the tile's heads.
    pub(super) live: u32,
}

impl Staged {
    /// Room for a call's chunks, written by [`stage`]: a `Staged` made per chunk, zeroed and
    /// returned by value, cost a memset and a memmove a chunk (V3 tile 10.8 ns a row against
    /// 10.3, one thread, AMD EPYC Zen 3).
    pub(super) fn new() -> Self {
        Staged {
            ws: [[0.0; CHUNK]; TILE_Q],
            factors: [0.0; TILE_Q],
            rows: [std::ptr::null(); CHUNK],
            live: 0,
        }
    }
}

/// Stages the chunk of `nc` rows from `c0` for query heads `q0..q0 + nq` into `staged`.
///
/// # Safety
/// AVX2; `weights[(q0 + q)·stride + c0 ..][..nc]` and `scales[c0..c0 + nc]` exist for `q < nq`.
#[allow(clippy::too_many_arguments)]
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn stage(
    staged: &mut Staged,
    src: &RowSource,
    weights: &[f32],
    (scales, level_step): (&[f32], f32),
    stride: usize,
    (q0, nq): (usize, usize),
    c0: usize,
    nc: usize,
) {
    staged.live = 0;
    // SAFETY: `*const u8` and `MaybeUninit<*const u8>` have one layout; every one of the
    // `nc` slots is written.
    src.rows_by_page(c0, unsafe {
        &mut *(&mut staged.rows[..nc] as *mut [*const u8] as *mut [MaybeUninit<*const u8>])
    });
    let blocks = nc.div_ceil(8);
    // SAFETY: masked loads stay inside the chunk's `nc` weights and scales (the contract).
    unsafe {
        for q in 0..nq {
            let w = weights.as_ptr().add((q0 + q) * stride + c0);
            let s = scales.as_ptr().add(c0);
            for h in 0..blocks {
                let m = tail_mask((nc - 8 * h).min(8));
                let wv = _mm256_maskload_ps(w.add(8 * h), m);
                let sv = _mm256_maskload_ps(s.add(8 * h), m);
                _mm256_storeu_ps(staged.ws[q].as_mut_ptr().add(8 * h), _mm256_mul_ps(wv, sv));
                let nonzero = _mm256_cmp_ps::<_CMP_NEQ_UQ>(wv, _mm256_setzero_ps());
                let bits = _mm256_movemask_ps(_mm256_and_ps(nonzero, _mm256_castsi256_ps(m)));
                staged.live |= (bits as u32) << (8 * h);
            }
            // Lanes past the chunk's blocks take no weight (a full chunk has none: an empty
            // `fill` is still a `memset` call).
            if 8 * blocks < CHUNK {
                staged.ws[q][8 * blocks..].fill(0.0);
            }
            staged.factors[q] =
                super::grid::quantize_chunk_x86::<__m256>(&mut staged.ws[q], level_step);
        }
    }
}

/// One register tile: `NQ` heads from `q0` × the `NG` groups in `groups` (one segment of
/// `W`-bit codes), over the chunk's live rows.
///
/// # Safety
/// AVX2; `acc` is `[n_qh][d]` with `q0 + NQ <= n_qh`; the groups lie below `d`; the chunk's
/// rows are rows of `src`.
#[allow(clippy::too_many_arguments, clippy::needless_range_loop)]
#[inline(always)]
unsafe fn tile<const NQ: usize, const NG: usize, const W: i32>(
    lookup: &Lookup,
    groups: &[Group],
    staged: &Staged,
    acc: *mut f32,
    d: usize,
    q0: usize,
) {
    // SAFETY (all accesses): masked accumulator lanes stay inside their rows of acc; group
    // reads stay inside their row plus `OVERREAD` bytes, which `src` guarantees.
    unsafe {
        let mut a = [[_mm256_setzero_ps(); NG]; NQ];
        let mut live = staged.live;
        while live != 0 {
            let t = live.trailing_zeros() as usize;
            live &= live - 1;
            let row = staged.rows[t];
            let mut x = [_mm256_setzero_ps(); NG];
            for g in 0..NG {
                let word = (row.add(groups[g].byte) as *const i32).read_unaligned();
                x[g] = lookup.levels::<W>(word);
            }
            for q in 0..NQ {
                let w = _mm256_broadcast_ss(&staged.ws[q][t]);
                for g in 0..NG {
                    a[q][g] = _mm256_fmadd_ps(w, x[g], a[q][g]);
                }
            }
        }
        // The chunk's exact sums, added once: a multiply, then an add.
        for q in 0..NQ {
            let factor = _mm256_set1_ps(staged.factors[q]);
            for g in 0..NG {
                let at = acc.add((q0 + q) * d + groups[g].first);
                let sum = _mm256_mul_ps(a[q][g], factor);
                let n = groups[g].n;
                __m256::store_part(at, n, _mm256_add_ps(__m256::load_part(at, n), sum));
            }
        }
    }
}

/// [`tile`] for `nq` heads × `groups.len()` groups (each 1..=3).
///
/// # Safety
/// As [`tile`].
#[allow(clippy::too_many_arguments)]
#[inline(always)]
unsafe fn tile_of<const W: i32>(
    lookup: &Lookup,
    groups: &[Group],
    staged: &Staged,
    acc: *mut f32,
    d: usize,
    q0: usize,
    nq: usize,
) {
    macro_rules! run {
        ($nq:literal, $ng:literal) => {
            tile::<$nq, $ng, W>(lookup, groups, staged, acc, d, q0)
        };
    }
    // SAFETY: forwarded from the caller.
    unsafe {
        match (nq, groups.len()) {
            (3, 3) => run!(3, 3),
            (3, 2) => run!(3, 2),
            (3, _) => run!(3, 1),
            (2, 3) => run!(2, 3),
            (2, 2) => run!(2, 2),
            (2, _) => run!(2, 1),
            (_, 3) => run!(1, 3),
            (_, 2) => run!(1, 2),
            _ => run!(1, 1),
        }
    }
}

/// `acc[qh][c] += Σ_j (weights[qh·stride + j] · scales[j]) · level_c(code_{j,c})`.
///
/// # Safety
/// AVX2; shapes as checked by `super::accumulate_codes`; [`applies`] holds for the layout.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn accumulate(r: CodedRows<'_>, weights: &[f32], stride: usize, acc: &mut [f32]) {
    let page_rows = r.scales.len().max(1);
    // SAFETY: forwarded; one page holding every row.
    unsafe { accumulate_pages(&[r.codes], page_rows, r, weights, stride, acc) }
}

/// [`accumulate`] over a run of pages: row `j` is row `j % page_rows` of
/// `pages[j / page_rows]` (`r.codes` is not read), so the tile set-up, the level tables and the
/// group plan are built once per run and each 32-row chunk may span pages.
///
/// # Safety
/// AVX2; [`applies`] holds for the layout; `pages.len() <= MAX_PAGES`, they hold the
/// `r.scales.len()` rows; weights and `acc` as checked by `super::accumulate_codes`.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn accumulate_pages(
    pages: &[&[u8]],
    page_rows: usize,
    r: CodedRows<'_>,
    weights: &[f32],
    stride: usize,
    acc: &mut [f32],
) {
    let layout = r.layout;
    let (d, bytes, rows) = (layout.d, layout.bytes(), r.scales.len());
    let n_qh = acc.len() / d;
    let segs = layout.segments().expect("narrow layouts have segments");
    let grid =
        super::grid::GridLevels::new(layout, r.levels).expect("narrow layouts are on the grid");
    let levels = grid.levels();

    // Each segment's groups, and the register tiles that cover them.
    let mut lookups = [None; 2];
    let mut groups = [Group::default(); MAX_DIM / 8 + 2];
    let mut tiles = [(0usize, 0usize, 0usize); MAX_DIM / 8 + 2];
    let (mut n_groups, mut n_tiles) = (0, 0);
    let mut max_end = 0;
    for (i, seg) in segs.iter().enumerate() {
        if seg.len == 0 {
            continue;
        }
        let table = levels.table(layout, seg.first);
        // SAFETY: AVX2; grid tables hold 16 levels.
        lookups[i] = Some(unsafe { Lookup::new(seg.width, table) });
        let first_group = n_groups;
        for g in 0..seg.len.div_ceil(8) {
            let group = Group {
                first: seg.first + 8 * g,
                n: (seg.len - 8 * g).min(8),
                byte: seg.byte + g * seg.width as usize,
            };
            max_end = max_end.max(group.byte + 4);
            groups[n_groups] = group;
            n_groups += 1;
        }
        // Tiles of TILE_G groups; a remainder of one borrows from the tile before it (2 + 2
        // keeps more FMAs per decoded row than 3 + 1).
        let mut lo = first_group;
        while lo < n_groups {
            let left = n_groups - lo;
            let take = if left == TILE_G + 1 {
                2
            } else {
                left.min(TILE_G)
            };
            tiles[n_tiles] = (i, lo, lo + take);
            n_tiles += 1;
            lo += take;
        }
    }

    let mut pads = Pads::uninit();
    let src = row_source(pages, page_rows, rows, bytes, max_end, OVERREAD, &mut pads);

    let acc = acc.as_mut_ptr();
    let mut staged = Staged::new();
    for c0 in (0..rows).step_by(CHUNK) {
        let nc = (rows - c0).min(CHUNK);
        crate::prefetch::pump_rows(nc);
        for q0 in (0..n_qh).step_by(TILE_Q) {
            let nq = (n_qh - q0).min(TILE_Q);
            // SAFETY: AVX2; the chunk's weights and scales exist (checked shapes).
            let grid = (r.scales, grid.step);
            unsafe { stage(&mut staged, &src, weights, grid, stride, (q0, nq), c0, nc) };
            if staged.live == 0 {
                continue;
            }
            for &(seg, lo, hi) in &tiles[..n_tiles] {
                let lookup = lookups[seg].as_ref().expect("tiles of non-empty segments");
                let gs = &groups[lo..hi];
                // SAFETY: AVX2; heads q0..q0 + nq and the groups lie inside acc; rows of src.
                unsafe {
                    match segs[seg].width {
                        4 => tile_of::<4>(lookup, gs, &staged, acc, d, q0, nq),
                        3 => tile_of::<3>(lookup, gs, &staged, acc, d, q0, nq),
                        2 => tile_of::<2>(lookup, gs, &staged, acc, d, q0, nq),
                        _ => tile_of::<1>(lookup, gs, &staged, acc, d, q0, nq),
                    }
                }
            }
        }
    }
}

/// Zero bytes written after a padded tail: a fixed count, at least any kernel's overread.
const ZEROS: usize = MAX_OVERREAD + 1;

/// Copies `src` (a page's tail: a row or two) to `dst` in 8-byte pieces, the last one
/// overlapping the one before it: `copy_nonoverlapping` of a run-time length is a `memcpy`
/// call, two of them per page of every value scan (with the padding's `memset`).
///
/// # Safety
/// `dst` has room for `src.len()` bytes and does not overlap it.
#[inline(always)]
unsafe fn copy_short(src: &[u8], dst: *mut u8) {
    const PIECE: usize = 8;
    let n = src.len();
    // SAFETY (all): pieces lie inside `src` and the first `n` bytes of `dst`.
    unsafe {
        if n < PIECE {
            for (i, &b) in src.iter().enumerate() {
                dst.add(i).write(b);
            }
            return;
        }
        let mut at = 0;
        while at + PIECE < n {
            let piece = (src.as_ptr().add(at) as *const [u8; PIECE]).read_unaligned();
            (dst.add(at) as *mut [u8; PIECE]).write_unaligned(piece);
            at += PIECE;
        }
        let last = (src.as_ptr().add(n - PIECE) as *const [u8; PIECE]).read_unaligned();
        (dst.add(n - PIECE) as *mut [u8; PIECE]).write_unaligned(last);
    }
}

/// Per-page room for the padded tails of a run (see [`row_source`]).
pub(super) type Pads = MaybeUninit<[[u8; PAD_BYTES]; MAX_PAGES]>;

/// Where each row of a run of pages is read from, for group reads that end at most `max_end`
/// bytes past a row's start and `overread` bytes past its end: rows whose reads stay inside
/// their page's codes in place, the last few of each page from a zero-padded copy in `pads`
/// (which must outlive the result).
pub(super) fn row_source(
    pages: &[&[u8]],
    page_rows: usize,
    rows: usize,
    bytes: usize,
    max_end: usize,
    overread: usize,
    pads: &mut Pads,
) -> RowSource {
    assert!(
        page_rows > 0 && rows.div_ceil(page_rows) <= pages.len().min(MAX_PAGES),
        "narrow accumulate: pages"
    );
    assert!(overread <= MAX_OVERREAD, "narrow accumulate: overread");
    // Only the used part of each page's pad is written (tail, then ZEROS zeros): a single
    // page call must not pay for clearing all MAX_PAGES pads.
    let pads = pads.as_mut_ptr() as *mut u8;
    let empty = PageSource {
        codes: std::ptr::null(),
        pad: std::ptr::null(),
        safe: 0,
    };
    let mut src = RowSource {
        pages: [empty; MAX_PAGES],
        bytes,
        page_rows,
    };
    for (p, codes) in pages.iter().take(rows.div_ceil(page_rows)).enumerate() {
        let in_page = (rows - p * page_rows).min(page_rows);
        let len = codes.len();
        let safe = if len >= max_end {
            ((len - max_end) / bytes + 1).min(in_page)
        } else {
            0
        };
        let tail = &codes[safe * bytes..in_page * bytes];
        assert!(
            tail.len() + ZEROS <= PAD_BYTES,
            "narrow accumulate: padded tail"
        );
        // SAFETY: slot p of the pads (p < MAX_PAGES) has room for the tail and ZEROS more
        // (ZEROS ≥ overread).
        let pad = unsafe {
            let pad = pads.add(p * PAD_BYTES);
            copy_short(tail, pad);
            (pad.add(tail.len()) as *mut [u8; ZEROS]).write_unaligned([0; ZEROS]);
            pad
        };
        src.pages[p] = PageSource {
            codes: codes.as_ptr(),
            pad,
            safe,
        };
    }
    src
}
