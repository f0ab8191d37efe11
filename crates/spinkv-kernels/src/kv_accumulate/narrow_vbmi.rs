//! AVX-512 accumulation of narrow value codes (the layouts [`super::narrow`] takes: every
//! channel 1..=4 bits, two byte-aligned segments) on the integer grid (`super::grid`), four
//! rows per instruction, for CPUs with AVX-512 VBMI and VNNI; without them the AVX2 narrow tile
//! runs.
//!
//! A group is 16 channels of four rows A..D. Sixteen codes of at most 4 bits fill at most 64
//! bits and start on a byte, so each row's group is one 64-bit load broadcast to every lane;
//! `vpmultishiftqb` cuts A's codes into byte 0 of each 32-bit lane and, merge-masked, B's, C's
//! and D's into bytes 1, 2 and 3; one `vpermb` (which reads the low 6 bits of each byte: the
//! table repeated every `2^width`) turns them into grid levels offset by 128, unsigned bytes.
//! Lane `i` then holds channel `i` of the four rows, and one `vpdpbusd` per query head adds
//! `Σ_r q_r · (ℓ_r + 128)` with the rows' grid weights broadcast as four signed bytes; the
//! offset comes back out as `128 · Σ_r q_r` per chunk. That is 5 shuffles per group and one
//! multiply-add per head per group for four rows, against 2 shuffles and one FMA per head per
//! group for each row in f32. The sums are exact int32, the reference's exact chunk sums, so
//! results are bit-identical to `scalar::accumulate_codes`.
//!
//! Where four rows fit two registers (at most 32 bytes a row: head dim 64 at up to 4 bits) and
//! no quad spans two pages, a quad's rows, back to back in their page, are two masked loads,
//! and a group is one `vpermt2b` gather and one cut ([`Cut`]) instead of four broadcasts and
//! four cuts; no row needs a padded copy. `attend_bench turbo 7680` (one thread, AMD EPYC
//! Zen 4): 243.5–245.0 µs per call against 253.5–254.9 with the broadcasts, in alternating
//! batches.

use super::grid::{chunk_factor, weight_scale, GridLevels, CHUNK};
use super::narrow::{row_source, Pads, RowSource, MAX_DIM, MAX_HEADS, TILE_Q};
use crate::codes::{CodeLayout, CodedRows, Levels};
use std::arch::x86_64::*;
use std::mem::MaybeUninit;

/// Channels per group (one zmm register of 16 32-bit lanes, four rows' bytes each).
const LANES: usize = 16;
/// Rows one multiply-add takes.
const ROWS: usize = 4;
/// Bytes a group's 64-bit read may run past its row's last byte.
const OVERREAD: usize = 7;
/// Channel groups per register tile: 3 heads × 4 groups = 12 accumulators, with each group's
/// control and table (8) and the decoded groups well inside the 32 zmm registers.
const TILE_G: usize = 4;
/// Merge masks of rows B, C, D: byte 1, 2 or 3 of every 32-bit lane.
const ROW_BYTES: [__mmask64; ROWS] = [
    0x1111_1111_1111_1111,
    0x2222_2222_2222_2222,
    0x4444_4444_4444_4444,
    0x8888_8888_8888_8888,
];
/// What the levels are offset by to make them unsigned bytes.
const LEVEL_OFFSET: i32 = 128;

/// Whether this CPU runs [`accumulate_pages`] (the caller has already settled on AVX-512
/// F/BW/VL; VBMI and VNNI are detected here — `is_x86_feature_detected!` caches them).
#[inline]
pub(crate) fn available() -> bool {
    std::arch::is_x86_feature_detected!("avx512vbmi")
        && std::arch::is_x86_feature_detected!("avx512vnni")
        && std::arch::is_x86_feature_detected!("avx512f")
        && std::arch::is_x86_feature_detected!("avx512bw")
}

/// How one segment's codes become offset grid levels.
#[derive(Clone, Copy)]
struct Lookup {
    /// `vpmultishiftqb` control: in 64-bit lane `k`, bytes 0..4 hold the bit offset of code
    /// `2k` and bytes 4..8 that of code `2k + 1` (row `r` fills bytes `r` and `4 + r`).
    control: __m512i,
    /// Grid levels + 128 of codes 0..64 as bytes, the `2^width` levels repeated.
    table: __m512i,
}

impl Lookup {
    /// # Safety
    /// AVX-512F; `table` holds at least `2^width` levels, integers `|ℓ| ≤ 127`; `width <= 4`.
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn new(width: u32, table: &[f32]) -> Self {
        let period = 1usize << width;
        let mut one = [0u8; 16];
        for (slot, &level) in one.iter_mut().zip(&table[..period]) {
            *slot = (level as i32 + LEVEL_OFFSET) as u8;
        }
        let mut levels = [0u8; 64];
        for run in levels.chunks_exact_mut(period) {
            run.copy_from_slice(&one[..period]);
        }
        let mut control = [0u8; 64];
        for (i, byte) in control.iter_mut().enumerate() {
            // Byte i of the 64-bit lane i / 8: code 2k or 2k + 1.
            let code = 2 * (i / 8) + (i % 8) / ROWS;
            *byte = (code as u32 * width) as u8;
        }
        // SAFETY: two 64-byte arrays.
        unsafe {
            Lookup {
                control: _mm512_loadu_si512(control.as_ptr() as *const _),
                table: _mm512_loadu_si512(levels.as_ptr() as *const _),
            }
        }
    }
}

/// How one group's codes are cut from four consecutive rows held in two registers (a quad of
/// back-to-back rows, at most 128 bytes): `vpermt2b` gathers into 64-bit lane `k` the two
/// bytes of each row that hold channels `2k` and `2k + 1` (row `r` in bytes `2r`, `2r + 1`),
/// then `vpmultishiftqb` moves channel `2k + j` of row `r` to byte `4j + r` — the lanes
/// [`decode_quad`] makes, for one gather and one cut instead of four broadcasts and four cuts.
#[derive(Clone, Copy)]
struct Cut {
    gather: __m512i,
    shift: __m512i,
}

impl Cut {
    /// # Safety
    /// AVX-512F; `4 · bytes <= 128`; `width <= 4`.
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn new(group: &Group, width: u32, bytes: usize) -> Self {
        let width = width as usize;
        let (mut gather, mut shift) = ([0u8; 64], [0u8; 64]);
        for k in 0..LANES / 2 {
            let bit = 2 * k * width;
            let (byte, offset) = (group.byte + bit / 8, bit % 8);
            for r in 0..ROWS {
                // Two codes of at most 4 bits from bit 0..8 of a byte end within two bytes.
                // Lanes past the group's channels are masked off when stored; 127 keeps their
                // index inside the two registers.
                for i in 0..2 {
                    gather[8 * k + 2 * r + i] = (r * bytes + byte + i).min(127) as u8;
                }
                for j in 0..2 {
                    shift[8 * k + 4 * j + r] = (16 * r + offset + j * width) as u8;
                }
            }
        }
        // SAFETY: two 64-byte arrays.
        unsafe {
            Cut {
                gather: _mm512_loadu_si512(gather.as_ptr() as *const _),
                shift: _mm512_loadu_si512(shift.as_ptr() as *const _),
            }
        }
    }
}

/// Where a run's rows are read from.
#[derive(Clone, Copy)]
enum Rows<'a> {
    /// Row by row, each group's 64-bit read inside a row or a padded copy.
    Padded(&'a RowSource),
    /// Quads of back-to-back rows in their pages (every page but the last holds whole quads),
    /// read by masked loads that stop at the last row.
    Contiguous {
        pages: &'a [&'a [u8]],
        page_rows: usize,
        bytes: usize,
    },
}

/// Rows staged at once (whole grid chunks): the tiles run over a block's chunks.
const BLOCK: usize = 8 * CHUNK;
/// Chunks per block.
const BLOCK_CHUNKS: usize = BLOCK / CHUNK;

/// One block's rows for every query head: grid weights as signed bytes (rows `4p..4p + 4` of a
/// chunk form the 32-bit quad `p`), each chunk's factor and `128 · Σ q` (the offset to take
/// back), where each row is read from, and per tile of `TILE_Q` heads and chunk the quads one
/// of them weights (bit `4p` of `live[tile][chunk]`).
struct Block {
    /// Written for every chunk of the block that `stage` took (rows past the block's end as 0).
    ws: [[MaybeUninit<i8>; BLOCK]; MAX_HEADS],
    factors: [[f32; BLOCK_CHUNKS]; MAX_HEADS],
    offsets: [[i32; BLOCK_CHUNKS]; MAX_HEADS],
    /// Written for every row of the block that `stage` took, and up to 3 rows after its last
    /// (copies of it: their weights are 0).
    rows: [MaybeUninit<*const u8>; BLOCK + ROWS - 1],
    /// Contiguous rows only: each quad's first row and the load masks of its bytes that are
    /// rows of the run ([`quad_masks`]).
    quads: [MaybeUninit<(*const u8, [u64; 2])>; BLOCK / ROWS],
    live: [[u32; BLOCK_CHUNKS]; MAX_HEADS / TILE_Q],
}

/// Stages rows `b0..b0 + nb` of the run for heads `0..n_qh` into `block`.
///
/// # Safety
/// AVX-512 F/BW; `weights[qh·stride + b0 ..][..nb]` and `scales[b0..b0 + nb]` exist for
/// `qh < n_qh <= MAX_HEADS`; `0 < nb <= BLOCK`; `b0` a multiple of `CHUNK`.
#[allow(clippy::needless_range_loop)]
#[inline(always)]
unsafe fn stage(
    src: Rows<'_>,
    (weights, stride): (&[f32], usize),
    (scales, level_step): (&[f32], f32),
    n_qh: usize,
    (b0, nb): (usize, usize),
    block: &mut Block,
) {
    match src {
        Rows::Padded(src) => {
            src.rows_by_page(b0, &mut block.rows[..nb]);
            for t in nb..nb.next_multiple_of(ROWS) {
                block.rows[t] = block.rows[nb - 1];
            }
        }
        Rows::Contiguous {
            pages,
            page_rows,
            bytes,
        } => {
            // Page by page: whole quads, then a partial one at the run's end (pages but the
            // last hold whole quads).
            let whole = quad_masks(ROWS * bytes);
            let (mut page, mut j) = (b0 / page_rows, b0 % page_rows);
            let (mut q, mut t) = (0, 0);
            while t < nb {
                let in_page = (page_rows - j).min(nb - t);
                let base = pages[page].as_ptr().wrapping_add(j * bytes);
                let full = in_page / ROWS;
                for (i, quad) in block.quads[q..q + full].iter_mut().enumerate() {
                    quad.write((base.wrapping_add(i * ROWS * bytes), whole));
                }
                q += full;
                let rest = in_page % ROWS;
                if rest > 0 {
                    let at = base.wrapping_add(full * ROWS * bytes);
                    block.quads[q].write((at, quad_masks(rest * bytes)));
                    q += 1;
                }
                (t, page, j) = (t + in_page, page + 1, 0);
            }
        }
    }
    block.live = [[0; BLOCK_CHUNKS]; MAX_HEADS / TILE_Q];
    // SAFETY: masked loads stay inside the block's `nb` weights and scales (the contract);
    // stores stay inside the block's arrays (chunk c < BLOCK_CHUNKS).
    unsafe {
        let s = scales.as_ptr().add(b0);
        for qh in 0..n_qh {
            let w = weights.as_ptr().add(qh * stride + b0);
            let live = &mut block.live[qh / TILE_Q];
            for c in 0..nb.div_ceil(CHUNK) {
                let mut halves = [_mm512_setzero_ps(); 2];
                let mut largest = _mm512_setzero_ps();
                for (h, half) in halves.iter_mut().enumerate() {
                    let at = CHUNK * c + LANES * h;
                    let m = ((1u32 << nb.saturating_sub(at).min(LANES)) - 1) as __mmask16;
                    let wv = _mm512_maskz_loadu_ps(m, w.add(at));
                    let sv = _mm512_maskz_loadu_ps(m, s.add(at));
                    *half = _mm512_mul_ps(wv, sv);
                    largest = _mm512_max_ps(largest, _mm512_abs_ps(*half));
                    let nonzero =
                        _mm512_mask_cmp_ps_mask::<_CMP_NEQ_UQ>(m, wv, _mm512_setzero_ps());
                    live[c] |= (nonzero as u32) << (LANES * h);
                }
                let largest = _mm512_reduce_max_ps(largest);
                let dst = block.ws[qh].as_mut_ptr().add(CHUNK * c) as *mut i8;
                match weight_scale(largest) {
                    Some(to_grid) => {
                        let k = _mm512_set1_ps(to_grid);
                        let mut total = _mm512_setzero_si512();
                        for (h, half) in halves.iter().enumerate() {
                            let q = _mm512_roundscale_ps::<
                                { _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC },
                            >(_mm512_mul_ps(*half, k));
                            let q = _mm512_cvtps_epi32(q);
                            total = _mm512_add_epi32(total, q);
                            _mm_storeu_si128(
                                dst.add(LANES * h) as *mut __m128i,
                                _mm512_cvtepi32_epi8(q),
                            );
                        }
                        block.factors[qh][c] = chunk_factor(largest, level_step);
                        block.offsets[qh][c] = LEVEL_OFFSET * _mm512_reduce_add_epi32(total);
                    }
                    None => {
                        _mm256_storeu_si256(dst as *mut __m256i, _mm256_setzero_si256());
                        block.factors[qh][c] = 0.0;
                        block.offsets[qh][c] = 0;
                    }
                }
            }
        }
        // A quad is live when any of its rows is.
        for tile in block.live.iter_mut() {
            for live in tile.iter_mut() {
                *live = (*live | (*live >> 1) | (*live >> 2) | (*live >> 3)) & 0x1111_1111;
            }
        }
    }
}

/// Up to 16 channels `first..first + n` of segment `seg`, packed from byte `byte` of a row.
#[derive(Clone, Copy, Default)]
struct Group {
    first: usize,
    n: usize,
    byte: usize,
    seg: usize,
}

/// One register tile: `NQ` heads from `q0` (a multiple of `TILE_Q`) × the `NG` groups in
/// `groups` (of either segment), over the live row quads of the block's first `n_chunks`
/// chunks, each chunk's exact sums added to `acc` once. With `DECODED` the quads are read from
/// `decoded` (the block decoded once for every head), without it decoded here: `CONTIGUOUS`,
/// from the staged quads by `cuts` (the tile's groups'), otherwise from the staged rows.
///
/// # Safety
/// AVX-512 F/BW/VBMI/VNNI; `acc` is `[n_qh][d]` with `q0 + NQ <= n_qh`; the groups lie below
/// `d`; the block's live rows are rows of the run, readable `OVERREAD` bytes past their end
/// (`CONTIGUOUS`: the staged quads are the run's); with `DECODED`, `decoded` holds the block's
/// quads from the tile's first group.
#[allow(clippy::needless_range_loop, clippy::too_many_arguments)]
#[inline(always)]
unsafe fn tile<const NQ: usize, const NG: usize, const DECODED: bool, const CONTIGUOUS: bool>(
    lookups: &[Lookup; 2],
    groups: &[Group],
    cuts: &[Cut],
    block: &Block,
    n_chunks: usize,
    decoded: Decoded,
    acc: *mut f32,
    d: usize,
    q0: usize,
) {
    // SAFETY (all accesses): masked accumulator lanes stay inside their rows of acc; group
    // reads stay inside their row plus `OVERREAD` bytes, which the row source guarantees; the
    // weight quads read lie inside the staged chunks.
    unsafe {
        let mut masks = [0 as __mmask16; NG];
        let mut control = [_mm512_setzero_si512(); NG];
        let mut table = [_mm512_setzero_si512(); NG];
        let mut cut = [_mm512_setzero_si512(); NG];
        for g in 0..NG {
            masks[g] = ((1u32 << groups[g].n) - 1) as __mmask16;
            table[g] = lookups[groups[g].seg].table;
            if CONTIGUOUS {
                (control[g], cut[g]) = (cuts[g].shift, cuts[g].gather);
            } else {
                control[g] = lookups[groups[g].seg].control;
            }
        }
        for c in 0..n_chunks {
            crate::prefetch::pump_rows_avx512(CHUNK);
            let mut live = block.live[q0 / TILE_Q][c];
            if live == 0 {
                continue;
            }
            let mut a = [[_mm512_setzero_si512(); NG]; NQ];
            while live != 0 {
                let t = c * CHUNK + live.trailing_zeros() as usize;
                live &= live - 1;
                let mut x = [_mm512_setzero_si512(); NG];
                let quad = if CONTIGUOUS && !DECODED {
                    load_quad(block, t)
                } else {
                    (_mm512_setzero_si512(), _mm512_setzero_si512())
                };
                for g in 0..NG {
                    x[g] = if DECODED {
                        _mm512_load_si512(decoded.at(t, g) as *const _)
                    } else if CONTIGUOUS {
                        cut_quad(cut[g], control[g], table[g], quad)
                    } else {
                        decode_quad(control[g], table[g], block, t, groups[g].byte)
                    };
                }
                for q in 0..NQ {
                    let quad = (block.ws[q0 + q].as_ptr().add(t) as *const i32).read_unaligned();
                    let w = _mm512_set1_epi32(quad);
                    for g in 0..NG {
                        a[q][g] = _mm512_dpbusd_epi32(a[q][g], x[g], w);
                    }
                }
            }
            // The chunk's exact sums (the levels' offset taken back), added once: a multiply,
            // then an add.
            for q in 0..NQ {
                let factor = _mm512_set1_ps(block.factors[q0 + q][c]);
                let offset = _mm512_set1_epi32(block.offsets[q0 + q][c]);
                for g in 0..NG {
                    let at = acc.add((q0 + q) * d + groups[g].first);
                    let sum = _mm512_cvtepi32_ps(_mm512_sub_epi32(a[q][g], offset));
                    let total = _mm512_add_ps(
                        _mm512_maskz_loadu_ps(masks[g], at),
                        _mm512_mul_ps(sum, factor),
                    );
                    _mm512_mask_storeu_ps(at, masks[g], total);
                }
            }
        }
    }
}

/// [`tile`] for `nq` heads × `groups.len()` groups (each 1..=4 and 1..=`TILE_Q`).
///
/// # Safety
/// As [`tile`].
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn tile_of<const DECODED: bool, const CONTIGUOUS: bool>(
    lookups: &[Lookup; 2],
    (groups, cuts): (&[Group], &[Cut]),
    (block, n_chunks): (&Block, usize),
    decoded: Decoded,
    acc: *mut f32,
    d: usize,
    q0: usize,
    nq: usize,
) {
    macro_rules! run {
        ($nq:literal, $ng:literal) => {
            tile::<$nq, $ng, DECODED, CONTIGUOUS>(
                lookups, groups, cuts, block, n_chunks, decoded, acc, d, q0,
            )
        };
    }
    // SAFETY: forwarded from the caller.
    unsafe {
        match (nq, groups.len()) {
            (3, 4) => run!(3, 4),
            (3, 3) => run!(3, 3),
            (3, 2) => run!(3, 2),
            (3, _) => run!(3, 1),
            (2, 4) => run!(2, 4),
            (2, 3) => run!(2, 3),
            (2, 2) => run!(2, 2),
            (2, _) => run!(2, 1),
            (_, 4) => run!(1, 4),
            (_, 3) => run!(1, 3),
            (_, 2) => run!(1, 2),
            _ => run!(1, 1),
        }
    }
}

/// `acc[qh][c] += Σ_j (weights[qh·stride + j] · scales[j]) · level_c(code_{j,c})`, on the grid.
///
/// # Safety
/// [`available`]; shapes as checked by `super::accumulate_codes`;
/// `super::narrow::applies(layout, 1)` holds.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx512vnni,avx2,fma,f16c")]
pub(crate) unsafe fn accumulate(r: CodedRows<'_>, weights: &[f32], stride: usize, acc: &mut [f32]) {
    let page_rows = r.scales.len().max(1);
    // SAFETY: forwarded; one page holding every row.
    unsafe { accumulate_pages(&[r.codes], page_rows, r, weights, stride, acc) }
}

/// [`accumulate`] over a run of pages: row `j` is row `j % page_rows` of
/// `pages[j / page_rows]` (`r.codes` is not read); the tables and the group plan are built once
/// per run. The grid's chunks are the run's: pages of whole chunks (or one page).
///
/// Any number of query heads, `MAX_HEADS` at a time, a block of rows for every batch before
/// the next block; from [`DECODE_ONCE_HEADS`] heads on, each block's rows are decoded once for
/// all of them. Four rows per multiply-add beat decoding once into f32 for every head
/// (prefill).
///
/// # Safety
/// [`available`]; `super::narrow::applies(layout, 1)` holds;
/// `pages.len() <= super::narrow::MAX_PAGES`, they hold the `r.scales.len()` rows; weights and
/// `acc` as checked by `super::accumulate_codes`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx512vnni,avx2,fma,f16c")]
pub(crate) unsafe fn accumulate_pages(
    pages: &[&[u8]],
    page_rows: usize,
    r: CodedRows<'_>,
    weights: &[f32],
    stride: usize,
    acc: &mut [f32],
) {
    // The run's code lines asked for into L1 at once (they wait in L2, queued a tile ahead):
    // decode attention at depth 7,680 B/A 0.965, 0.977, 1.008, 0.957 in-process (turbo, 2
    // threads, AMD EPYC Zen 4).
    let bytes = r.layout.bytes();
    for (p, page) in pages.iter().enumerate() {
        let n = r.scales.len().saturating_sub(p * page_rows).min(page_rows) * bytes;
        crate::prefetch::to_l1(&page[..n.min(page.len())]);
    }
    let layout = r.layout;
    SETUP.with(|cell| {
        let mut cell = cell.borrow_mut();
        if cell
            .as_ref()
            .is_none_or(|setup| !setup.is_for(layout, r.levels))
        {
            // SAFETY: AVX-512F (the caller's contract).
            *cell = Some(Box::new(unsafe { Setup::new(layout, r.levels) }));
        }
        let setup = cell.as_deref().expect("set up just now");
        // SAFETY: forwarded from the caller; the setup is this layout's and levels'.
        unsafe { run(setup, pages, page_rows, r.scales, weights, stride, acc) }
    });
}

/// What a run's layout and levels fix: the grid, each segment's lookup, the groups in channel
/// order, the tiles that cover them (a tile may hold groups of both segments: each group
/// brings its own control and table) and each group's [`Cut`] from a quad. Built once per
/// thread for the last layout and levels seen (a codec's, the same every call): building it
/// per call was ~5 % of a decode attention at depth 7,680.
struct Setup {
    layout: CodeLayout,
    /// The float levels it was built from (`2^width` of each present table, zeros after).
    levels: [[f32; 16]; 2],
    step: f32,
    lookups: [Lookup; 2],
    groups: [Group; MAX_GROUPS],
    n_groups: usize,
    tiles: [(usize, usize); MAX_GROUPS],
    n_tiles: usize,
    /// Valid when four rows fit two registers ([`QUAD_BYTES`]).
    cuts: [Cut; MAX_GROUPS],
    /// How far past a row's start a group's 64-bit read ends.
    max_end: usize,
}

/// Groups of a row at most (both segments, each with a partial group).
const MAX_GROUPS: usize = MAX_DIM / LANES + 2;
/// Bytes of a quad that two registers hold.
const QUAD_BYTES: usize = 128;

thread_local! {
    static SETUP: std::cell::RefCell<Option<Box<Setup>>> = const { std::cell::RefCell::new(None) };
}

/// The used part of both level tables, zero-filled.
fn used_levels(layout: &CodeLayout, levels: Levels<'_>) -> [[f32; 16]; 2] {
    let mut out = [[0.0f32; 16]; 2];
    let present = [layout.n_hi > 0, layout.n_hi < layout.d];
    for (((out, table), width), present) in out
        .iter_mut()
        .zip([levels.hi, levels.lo])
        .zip([layout.hi, layout.lo])
        .zip(present)
    {
        if present {
            let n = 1usize << width;
            out[..n].copy_from_slice(&table[..n]);
        }
    }
    out
}

impl Setup {
    fn is_for(&self, layout: &CodeLayout, levels: Levels<'_>) -> bool {
        let same = |a: &[[f32; 16]; 2], b: &[[f32; 16]; 2]| {
            a.iter()
                .flatten()
                .zip(b.iter().flatten())
                .all(|(x, y)| x.to_bits() == y.to_bits())
        };
        self.layout == *layout && same(&self.levels, &used_levels(layout, levels))
    }

    /// # Safety
    /// AVX-512F; `super::narrow::applies(layout, 1)` holds.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    unsafe fn new(layout: &CodeLayout, levels: Levels<'_>) -> Self {
        let bytes = layout.bytes();
        let segs = layout.segments().expect("narrow layouts have segments");
        let grid = GridLevels::new(layout, levels).expect("narrow layouts are on the grid");
        let grid_levels = grid.levels();
        // SAFETY: AVX-512F; an empty segment's placeholder table is never read.
        let mut lookups = unsafe { [Lookup::new(0, &[0.0]); 2] };
        let mut groups = [Group::default(); MAX_GROUPS];
        let mut n_groups = 0;
        let mut max_end = 0;
        for (i, seg) in segs.iter().enumerate() {
            if seg.len == 0 {
                continue;
            }
            let table = grid_levels.table(layout, seg.first);
            // SAFETY: AVX-512F; grid tables hold 16 integer levels, |ℓ| ≤ 127.
            lookups[i] = unsafe { Lookup::new(seg.width, table) };
            for g in 0..seg.len.div_ceil(LANES) {
                let group = Group {
                    first: seg.first + LANES * g,
                    n: (seg.len - LANES * g).min(LANES),
                    byte: seg.byte + g * 2 * seg.width as usize,
                    seg: i,
                };
                max_end = max_end.max(group.byte + 8);
                groups[n_groups] = group;
                n_groups += 1;
            }
        }
        // Tiles of TILE_G groups; a remainder of one borrows from the tile before it.
        let mut tiles = [(0usize, 0usize); MAX_GROUPS];
        let mut n_tiles = 0;
        let mut lo = 0;
        while lo < n_groups {
            let left = n_groups - lo;
            let take = if left == TILE_G + 1 {
                3
            } else {
                left.min(TILE_G)
            };
            tiles[n_tiles] = (lo, lo + take);
            n_tiles += 1;
            lo += take;
        }
        let mut cuts = [Cut {
            gather: _mm512_setzero_si512(),
            shift: _mm512_setzero_si512(),
        }; MAX_GROUPS];
        if ROWS * bytes <= QUAD_BYTES {
            for (cut, group) in cuts.iter_mut().zip(&groups[..n_groups]) {
                // SAFETY: AVX-512F; 4 · bytes <= 128; narrow widths are at most 4.
                *cut = unsafe { Cut::new(group, segs[group.seg].width, bytes) };
            }
        }
        Setup {
            layout: *layout,
            levels: used_levels(layout, levels),
            step: grid.step,
            lookups,
            groups,
            n_groups,
            tiles,
            n_tiles,
            cuts,
            max_end,
        }
    }
}

/// [`accumulate_pages`] with its setup.
///
/// # Safety
/// As [`accumulate_pages`]; `setup` is the run's layout's and levels'.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx512vnni,avx2,fma,f16c")]
unsafe fn run(
    setup: &Setup,
    pages: &[&[u8]],
    page_rows: usize,
    scales: &[f32],
    weights: &[f32],
    stride: usize,
    acc: &mut [f32],
) {
    let layout = &setup.layout;
    let (d, bytes, rows) = (layout.d, layout.bytes(), scales.len());
    let n_groups = setup.n_groups;
    // Quads of back-to-back rows when four rows fit two registers and no quad spans pages.
    let contiguous =
        ROWS * bytes <= QUAD_BYTES && (page_rows.is_multiple_of(ROWS) || rows <= page_rows);
    let mut pads = Pads::uninit();
    let padded;
    let src = if contiguous {
        Rows::Contiguous {
            pages,
            page_rows,
            bytes,
        }
    } else {
        padded = row_source(
            pages,
            page_rows,
            rows,
            bytes,
            setup.max_end,
            OVERREAD,
            &mut pads,
        );
        Rows::Padded(&padded)
    };
    let plan = Plan {
        lookups: &setup.lookups,
        groups: &setup.groups[..n_groups],
        cuts: &setup.cuts[..if contiguous { n_groups } else { 0 }],
        tiles: &setup.tiles[..setup.n_tiles],
        src,
        scales,
        level_step: setup.step,
        d,
    };
    // SAFETY: forwarded from the caller; the plan is this run's.
    unsafe {
        if acc.len() / d >= DECODE_ONCE_HEADS {
            DECODED.with(|cell| {
                let mut buffer = cell.borrow_mut();
                buffer.resize(BLOCK / ROWS * n_groups, Zmm([0; 64]));
                if contiguous {
                    blocks::<true, true>(&plan, weights, stride, acc, &mut buffer)
                } else {
                    blocks::<true, false>(&plan, weights, stride, acc, &mut buffer)
                }
            })
        } else {
            if contiguous {
                blocks::<false, true>(&plan, weights, stride, acc, &mut [])
            } else {
                blocks::<false, false>(&plan, weights, stride, acc, &mut [])
            }
        }
    }
}

/// What [`blocks`] needs of a run: its groups and their tiles, its rows, scales and grid.
struct Plan<'a> {
    lookups: &'a [Lookup; 2],
    groups: &'a [Group],
    /// Each group's cut from a quad (contiguous rows only; empty otherwise).
    cuts: &'a [Cut],
    tiles: &'a [(usize, usize)],
    src: Rows<'a>,
    scales: &'a [f32],
    level_step: f32,
    d: usize,
}

/// The run's blocks of rows, every batch of `MAX_HEADS` heads of a block before the next
/// block. With `DECODE_ONCE` each block's quads are decoded once into `buffer` (`BLOCK / ROWS ·
/// groups` registers) for every tile of heads; without it (decode: one batch, one tile) each
/// tile decodes its own, and this instance is the plain loop.
///
/// # Safety
/// As [`accumulate_pages`]; `buffer` as said with `DECODE_ONCE`.
#[inline(never)]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx512vnni,avx2,fma,f16c")]
unsafe fn blocks<const DECODE_ONCE: bool, const CONTIGUOUS: bool>(
    plan: &Plan<'_>,
    weights: &[f32],
    stride: usize,
    acc: &mut [f32],
    buffer: &mut [Zmm],
) {
    let (d, rows) = (plan.d, plan.scales.len());
    // Weights and row addresses are left unset: `stage` writes every row the tiles read
    // (~4 KiB per call not cleared; a one-page call reads 32 rows of it).
    let block = &mut Block {
        ws: [[MaybeUninit::uninit(); BLOCK]; MAX_HEADS],
        factors: [[0.0; BLOCK_CHUNKS]; MAX_HEADS],
        offsets: [[0; BLOCK_CHUNKS]; MAX_HEADS],
        rows: [MaybeUninit::uninit(); BLOCK + ROWS - 1],
        quads: [MaybeUninit::uninit(); BLOCK / ROWS],
        live: [[0; BLOCK_CHUNKS]; MAX_HEADS / TILE_Q],
    };
    for b0 in (0..rows).step_by(BLOCK) {
        let nb = (rows - b0).min(BLOCK);
        let n_chunks = nb.div_ceil(CHUNK);
        let mut decoded = None;
        for (batch, acc) in acc.chunks_mut(MAX_HEADS * d).enumerate() {
            let n_qh = acc.len() / d;
            let weights = &weights[batch * MAX_HEADS * stride..];
            let acc = acc.as_mut_ptr();
            // SAFETY: AVX-512F; the block's weights and scales exist (checked shapes), a batch
            // has at most MAX_HEADS heads.
            let grid = (plan.scales, plan.level_step);
            unsafe { stage(plan.src, (weights, stride), grid, n_qh, (b0, nb), block) };
            if DECODE_ONCE && decoded.is_none() {
                // SAFETY: AVX-512 VBMI (this function's features); `stage` set every row of
                // the block's quads; the buffer holds BLOCK / ROWS quads of every group.
                decoded = Some(unsafe { decode_block::<CONTIGUOUS>(plan, block, nb, buffer) });
            }
            for q0 in (0..n_qh).step_by(TILE_Q) {
                let nq = (n_qh - q0).min(TILE_Q);
                if block.live[q0 / TILE_Q][..n_chunks].iter().all(|&l| l == 0) {
                    continue;
                }
                for &(lo, hi) in plan.tiles {
                    let from = decoded.map_or(Decoded::NONE, |d: Decoded| d.starting_at(lo));
                    // SAFETY: AVX-512 VBMI/VNNI; heads q0..q0 + nq and the groups lie inside
                    // the batch's acc; live rows are rows of src, readable OVERREAD bytes past
                    // their end; with DECODE_ONCE the decoded quads cover the block.
                    unsafe {
                        let groups = (&plan.groups[lo..hi], plan.cuts.get(lo..hi).unwrap_or(&[]));
                        let block = (&*block, n_chunks);
                        tile_of::<DECODE_ONCE, CONTIGUOUS>(
                            plan.lookups,
                            groups,
                            block,
                            from,
                            acc,
                            d,
                            q0,
                            nq,
                        )
                    };
                }
            }
        }
    }
}

/// Query heads from which a block's rows are decoded once (`decode_block`) and read back by
/// every tile of `TILE_Q` heads, instead of decoded again for each: prefill, where an item has
/// tens to hundreds of heads. Prefill of 256 tokens after 512 (SmolLM2-135M F16, turbo, 2
/// threads, AMD EPYC Zen 4): value scan 53.8, 63.6, 52.9 thread-ms against 72.8, 71.0, 73.0
/// in alternating runs; in-process A/B of prefill tok/s (B decodes once) 0.974 and 1.041 there,
/// 1.012 for 40 tokens after 1,024, 1.073 for 256 after 3,840.
const DECODE_ONCE_HEADS: usize = 2 * TILE_Q;

/// One 64-byte register's worth of decoded levels, aligned for whole-register loads.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Zmm([u8; 64]);

thread_local! {
    /// A block's decoded quads (`decode_block`), reused across calls.
    static DECODED: std::cell::RefCell<Vec<Zmm>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Where a block's decoded quads are: quad `t / 4`'s group `first + g` at
/// `base + (t / 4) · groups + first + g`.
#[derive(Clone, Copy)]
struct Decoded {
    base: *const Zmm,
    groups: usize,
    first: usize,
}

impl Decoded {
    /// No quads (a tile that decodes its own).
    const NONE: Decoded = Decoded {
        base: std::ptr::null(),
        groups: 0,
        first: 0,
    };

    /// The same quads seen from group `first` on (a tile's groups).
    fn starting_at(self, first: usize) -> Decoded {
        Decoded { first, ..self }
    }

    /// The register of row quad `t / 4` (`t` its first row) and the tile's group `g`.
    ///
    /// # Safety
    /// `t` a row of the decoded block, `first + g` one of its groups.
    #[inline(always)]
    unsafe fn at(self, t: usize, g: usize) -> *const Zmm {
        // SAFETY: as the caller guarantees.
        unsafe { self.base.add(t / ROWS * self.groups + self.first + g) }
    }
}

/// One group of row quad `t` of the staged block (its codes from byte `byte` of each row) as
/// offset grid levels: lane `i` holds channel `i` of the four rows, in bytes 0..4.
///
/// # Safety
/// AVX-512 F/BW/VBMI; rows `t..t + 4` staged, each readable 8 bytes from `byte`.
#[inline(always)]
unsafe fn decode_quad(
    control: __m512i,
    table: __m512i,
    block: &Block,
    t: usize,
    byte: usize,
) -> __m512i {
    // SAFETY: as the caller guarantees.
    unsafe {
        let word = |r: usize| {
            let row = block.rows[t + r].assume_init();
            _mm512_set1_epi64((row.add(byte) as *const i64).read_unaligned())
        };
        let mut codes = _mm512_multishift_epi64_epi8(control, word(0));
        for (r, &bytes) in ROW_BYTES.iter().enumerate().skip(1) {
            codes = _mm512_mask_multishift_epi64_epi8(codes, bytes, control, word(r));
        }
        _mm512_permutexvar_epi8(codes, table)
    }
}

/// Row quad `t` of the staged block (contiguous rows), its bytes in two registers: the rows
/// past the run's last are zeros.
///
/// # Safety
/// AVX-512 F/BW; the block's quads staged (`Rows::Contiguous`), `t` a multiple of 4 below its
/// rows.
#[inline(always)]
unsafe fn load_quad(block: &Block, t: usize) -> (__m512i, __m512i) {
    // SAFETY: as the caller guarantees; the masked loads stop at the quad's present bytes.
    unsafe {
        let (at, [low, high]) = block.quads[t / ROWS].assume_init();
        (
            _mm512_maskz_loadu_epi8(low, at as *const i8),
            _mm512_maskz_loadu_epi8(high, at.wrapping_add(64) as *const i8),
        )
    }
}

/// The masks of a quad's first `present` bytes in its two 64-byte loads.
fn quad_masks(present: usize) -> [u64; 2] {
    let mask = |n: usize| if n >= 64 { u64::MAX } else { (1u64 << n) - 1 };
    [mask(present), mask(present.saturating_sub(64))]
}

/// One group of a quad [`load_quad`] loaded, by its [`Cut`], as offset grid levels laid out as
/// [`decode_quad`] lays them.
///
/// # Safety
/// AVX-512 F/BW/VBMI.
#[inline(always)]
unsafe fn cut_quad(
    gather: __m512i,
    shift: __m512i,
    table: __m512i,
    (a, b): (__m512i, __m512i),
) -> __m512i {
    // SAFETY: the caller's features.
    unsafe {
        let codes = _mm512_multishift_epi64_epi8(shift, _mm512_permutex2var_epi8(a, gather, b));
        _mm512_permutexvar_epi8(codes, table)
    }
}

/// Every row quad of the staged block decoded as [`tile`] decodes one: lane `i` of group `g`
/// holds channel `groups[g].first + i` of the quad's four rows as offset grid levels.
///
/// # Safety
/// AVX-512 F/BW/VBMI; `stage` wrote the block's rows (`nb` and the copies up to a whole
/// quad); `buffer` holds `BLOCK / ROWS · groups.len()` registers.
#[inline(always)]
unsafe fn decode_block<const CONTIGUOUS: bool>(
    plan: &Plan<'_>,
    block: &Block,
    nb: usize,
    buffer: &mut [Zmm],
) -> Decoded {
    let (groups, n_groups) = (plan.groups, plan.groups.len());
    // SAFETY: rows t..t + 4 were staged; group reads stay inside their row plus OVERREAD
    // bytes (the row source) or inside the staged quad (contiguous); stores stay inside the
    // buffer (t / 4 < BLOCK / ROWS).
    unsafe {
        for t in (0..nb).step_by(ROWS) {
            let quad = if CONTIGUOUS {
                load_quad(block, t)
            } else {
                (_mm512_setzero_si512(), _mm512_setzero_si512())
            };
            for (g, group) in groups.iter().enumerate() {
                let lookup = &plan.lookups[group.seg];
                let x = if CONTIGUOUS {
                    let cut = &plan.cuts[g];
                    cut_quad(cut.gather, cut.shift, lookup.table, quad)
                } else {
                    decode_quad(lookup.control, lookup.table, block, t, group.byte)
                };
                let at = buffer.as_mut_ptr().add(t / ROWS * n_groups + g);
                _mm512_store_si512(at as *mut _, x);
            }
        }
    }
    Decoded {
        base: buffer.as_ptr(),
        groups: n_groups,
        first: 0,
    }
}

#[cfg(test)]
mod tests {
    use super::super::{accumulate_as_pages, narrow, scalar};
    use crate::kv_score::for_each_coded_block;
    use crate::test_util::{random_vec, Rng};

    /// The VBMI/VNNI tile itself (the dispatcher would fall back to the AVX2 tile without
    /// them), bit for bit against the reference: one block, and the same rows as runs of pages
    /// (against the reference page by page).
    #[test]
    fn vbmi_tile_is_bit_exact() {
        if !(super::available() && crate::Isa::Avx512.cpu_supports()) {
            eprintln!("skipped: no avx512vbmi/vnni (or avx512 f/bw/vl) on this CPU");
            return;
        }
        let mut rng = Rng::new(61);
        let stride = 41;
        let mut ran = 0;
        for_each_coded_block(&mut rng, |rng, layout, block, n_qh, rows| {
            if !narrow::applies(layout, n_qh) {
                return Ok(());
            }
            let weights: Vec<f32> = (0..n_qh * stride)
                .map(|i| {
                    let w = rng.uniform().abs();
                    if i % stride == 3 || w < 0.2 {
                        0.0
                    } else {
                        w
                    }
                })
                .collect();
            let start = random_vec(rng.next_u64(), n_qh * layout.d);
            let mut want = start.clone();
            scalar::accumulate_codes(block, &weights, stride, &mut want);
            let mut got = start.clone();
            // SAFETY: VBMI and AVX-512 detected above; narrow::applies holds; shapes as built.
            unsafe { super::accumulate(block, &weights, stride, &mut got) };
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            let what = format!(
                "d={} {}/{}x{} n_qh={n_qh} rows={rows}",
                layout.d, layout.hi, layout.lo, layout.n_hi
            );
            assert_eq!(bits(&got), bits(&want), "block {what}");
            for page_rows in [1usize, 5, 16, 32] {
                let as_pages = |isa| {
                    // SAFETY: as above (scalar runs anywhere).
                    unsafe {
                        accumulate_as_pages(isa, block, rows, page_rows, &weights, stride, &start)
                    }
                };
                let (paged, want) = (as_pages(crate::Isa::Avx512), as_pages(crate::Isa::Scalar));
                assert_eq!(bits(&paged), bits(&want), "pages of {page_rows} {what}");
            }
            ran += 1;
            Ok(())
        })
        .unwrap();
        assert!(ran > 0, "no narrow layout in the parity sweep");
        eprintln!("avx512vbmi: narrow value tile bit-exact on {ran} blocks");
    }

    /// Negative weights and scales (the grid's weights are signed bytes, the levels' offset
    /// taken back per chunk), chunks with no weight, tiny ones, and a ragged last quad, bit for
    /// bit against the reference.
    #[test]
    fn vbmi_tile_takes_signed_and_degenerate_weights() {
        if !(super::available() && crate::Isa::Avx512.cpu_supports()) {
            eprintln!("skipped: no avx512vbmi/vnni (or avx512 f/bw/vl) on this CPU");
            return;
        }
        let mut rng = Rng::new(63);
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        for (d, half_bits, rows) in [(64usize, 6u8, 99usize), (64, 7, 130), (128, 4, 67)] {
            let layout = crate::codes::CodeLayout::for_half_bits(d, half_bits);
            let (packed, hi, lo) = crate::kv_score::random_block(&mut rng, &layout, rows);
            let levels = crate::codes::Levels { hi: &hi, lo: &lo };
            let scales: Vec<f32> = (0..rows)
                .map(|j| match j % 11 {
                    0 => 0.0,
                    1 => -0.7,
                    _ => 0.5 + rng.uniform(),
                })
                .collect();
            let block = crate::codes::CodedRows::new(&packed, &layout, levels, &scales);
            let n_qh = 5;
            let weights: Vec<f32> = (0..n_qh * rows)
                .map(|i| {
                    let (qh, j) = (i / rows, i % rows);
                    match (qh, j / 32) {
                        (1, 1) => 0.0,            // a chunk with no weight
                        (2, 0) => 1e-39,          // too small for the grid's step
                        (3, _) => -rng.uniform(), // every weight negative
                        _ => rng.uniform(),       // signed
                    }
                })
                .collect();
            let start = random_vec(rng.next_u64(), n_qh * d);
            let mut want = start.clone();
            scalar::accumulate_codes(block, &weights, rows, &mut want);
            let mut got = start.clone();
            // SAFETY: VBMI/VNNI and AVX-512 detected above; narrow::applies holds for the layout.
            unsafe { super::accumulate(block, &weights, rows, &mut got) };
            assert_eq!(bits(&got), bits(&want), "d={d} {half_bits}/2 bits");
            let as_pages = |isa| {
                // SAFETY: as above (scalar runs anywhere).
                unsafe { accumulate_as_pages(isa, block, rows, 32, &weights, rows, &start) }
            };
            let (paged, want) = (as_pages(crate::Isa::Avx512), as_pages(crate::Isa::Scalar));
            assert_eq!(bits(&paged), bits(&want), "pages d={d} {half_bits}/2 bits");
        }
    }

    /// Calls longer than one staged block (256 rows): one page of 600 rows, and runs of 8
    /// pages of 64 and 100 rows, for the presets' value rates at head dims 64 and 128.
    #[test]
    fn vbmi_tile_is_bit_exact_past_one_block() {
        if !(super::available() && crate::Isa::Avx512.cpu_supports()) {
            eprintln!("skipped: no avx512vbmi/vnni (or avx512 f/bw/vl) on this CPU");
            return;
        }
        let mut rng = Rng::new(62);
        let rows = 600;
        for (d, half_bits) in [(64, 6), (64, 7), (128, 4), (128, 8)] {
            let layout = crate::codes::CodeLayout::for_half_bits(d, half_bits);
            let (packed, hi, lo) = crate::kv_score::random_block(&mut rng, &layout, rows);
            let levels = crate::codes::Levels { hi: &hi, lo: &lo };
            let scales: Vec<f32> = (0..rows).map(|_| 1.0 + rng.uniform()).collect();
            let block = crate::codes::CodedRows::new(&packed, &layout, levels, &scales);
            for n_qh in [3usize, 9] {
                let weights: Vec<f32> = (0..n_qh * rows)
                    .map(|i| if i % 7 == 0 { 0.0 } else { rng.uniform().abs() })
                    .collect();
                let start = random_vec(rng.next_u64(), n_qh * d);
                let mut want = start.clone();
                scalar::accumulate_codes(block, &weights, rows, &mut want);
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                let mut got = start.clone();
                // SAFETY: VBMI and AVX-512 detected above; narrow::applies holds (n_qh <= 9).
                unsafe { super::accumulate(block, &weights, rows, &mut got) };
                assert_eq!(bits(&got), bits(&want), "one page d={d} {half_bits}/2 bits");
                for page_rows in [64usize, 100] {
                    let as_pages = |isa| {
                        // SAFETY: as above (scalar runs anywhere).
                        unsafe {
                            accumulate_as_pages(isa, block, rows, page_rows, &weights, rows, &start)
                        }
                    };
                    let (paged, want) =
                        (as_pages(crate::Isa::Avx512), as_pages(crate::Isa::Scalar));
                    assert_eq!(
                        bits(&paged),
                        bits(&want),
                        "pages of {page_rows} d={d} {half_bits}/2 bits n_qh={n_qh}"
                    );
                }
            }
        }
    }
}
