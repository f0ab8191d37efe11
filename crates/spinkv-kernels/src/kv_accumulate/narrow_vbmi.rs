//! AVX-512 accumulation of narrow value codes (the layouts [`super::narrow`] takes: every
//! channel 1..=4 bits, two byte-aligned segments), 16 channels per register, for CPUs with
//! AVX-512 VBMI; without VBMI the AVX2 narrow tile runs instead.
//!
//! Sixteen codes of at most 4 bits fill at most 64 bits and start on a byte, so a group is one
//! 64-bit load broadcast to every lane and one `vpmultishiftqb` (usually one instruction with
//! the broadcast folded in): its control puts the bits of code `i` at the bottom of 32-bit
//! lane `i`. `vpermps` reads only the low 4 bits of each lane, so the whole level table (16
//! entries, repeated for narrower codes) sits in one register and needs no mask or second
//! table. A group costs 2 instructions for 16 channels, against 3 per 8 for the AVX2 tile, and
//! each weight broadcast folds into its FMA. The arithmetic is the reference's: `acc += (w ·
//! scale) · level` as one FMA per element, rows in order, so results are bit-identical to
//! `scalar::accumulate_codes`.

use super::narrow::{row_source, Pads, RowSource, CHUNK, MAX_DIM, MAX_HEADS, TILE_Q};
use crate::codes::CodedRows;
use std::arch::x86_64::*;
use std::mem::MaybeUninit;

/// Channels per group (one zmm register of f32).
const LANES: usize = 16;
/// Bytes a group's 64-bit read may run past its row's last byte.
const OVERREAD: usize = 7;
/// Channel groups per register tile: 3 heads × 4 groups = 12 accumulators, with each group's
/// control and table (8) and the decoded groups well inside the 32 zmm registers.
const TILE_G: usize = 4;

/// Whether this CPU runs [`accumulate_pages`] (the caller has already settled on AVX-512
/// F/BW/VL; VBMI is detected here, once per call — `is_x86_feature_detected!` caches it).
#[inline]
pub(crate) fn available() -> bool {
    std::arch::is_x86_feature_detected!("avx512vbmi")
        && std::arch::is_x86_feature_detected!("avx512f")
        && std::arch::is_x86_feature_detected!("avx512bw")
}

/// How one segment's codes become levels.
#[derive(Clone, Copy)]
struct Lookup {
    /// `vpmultishiftqb` control: byte `4i` holds the bit offset `i · width` of code `i`.
    control: __m512i,
    /// Levels of codes 0..16 (for widths below 4 the table repeated every `2^width` entries:
    /// `vpermps` reads the index's low 4 bits, the upper ones belong to the next code).
    table: __m512,
}

impl Lookup {
    /// # Safety
    /// AVX-512F; `table` holds at least `2^width` levels; `width <= 4`.
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn new(width: u32, table: &[f32]) -> Self {
        let period = 1usize << width;
        let mut levels = [0.0f32; LANES];
        for (i, slot) in levels.iter_mut().enumerate() {
            *slot = table[i % period];
        }
        let mut control = [0u8; 64];
        for i in 0..LANES {
            control[4 * i] = (i as u32 * width) as u8;
        }
        // SAFETY: a 16-float and a 64-byte array.
        unsafe {
            Lookup {
                control: _mm512_loadu_si512(control.as_ptr() as *const _),
                table: _mm512_loadu_ps(levels.as_ptr()),
            }
        }
    }
}

/// Rows staged at once: the tiles keep their accumulators in registers across a block's
/// 32-row chunks.
const BLOCK: usize = 8 * CHUNK;

/// One block's rows for every query head: the weights times the rows' scales (the reference's
/// `w · scale`), where each row is read from, and per tile of `TILE_Q` heads and 32-row chunk
/// the rows one of them weights (bit `t` of `live[tile][chunk]`: row `chunk · 32 + t`).
struct Block {
    /// Written for every row of the block that `stage` took (not read past them).
    ws: [[MaybeUninit<f32>; BLOCK]; MAX_HEADS],
    /// Written for every row of the block that `stage` took.
    rows: [MaybeUninit<*const u8>; BLOCK],
    live: [[u32; BLOCK / CHUNK]; MAX_HEADS / TILE_Q],
}

/// Stages rows `b0..b0 + nb` of the run for heads `0..n_qh` into `block`, in place: lanes
/// past `nb` keep what they held (the tiles read only live rows). Building a zeroed copy per
/// 32-row chunk and choosing each row's source with a branch cost a third of the kernel.
///
/// # Safety
/// AVX-512F; `weights[qh·stride + b0 ..][..nb]` and `scales[b0..b0 + nb]` exist for
/// `qh < n_qh <= MAX_HEADS`; `nb <= BLOCK`.
#[inline(always)]
unsafe fn stage(
    src: &RowSource,
    (weights, stride): (&[f32], usize),
    scales: &[f32],
    n_qh: usize,
    (b0, nb): (usize, usize),
    block: &mut Block,
) {
    src.rows_by_page(b0, &mut block.rows[..nb]);
    block.live = [[0; BLOCK / CHUNK]; MAX_HEADS / TILE_Q];
    // SAFETY: masked loads stay inside the block's `nb` weights and scales (the contract).
    unsafe {
        let s = scales.as_ptr().add(b0);
        for qh in 0..n_qh {
            let w = weights.as_ptr().add(qh * stride + b0);
            let live = &mut block.live[qh / TILE_Q];
            for h in 0..nb.div_ceil(LANES) {
                let m = ((1u32 << (nb - LANES * h).min(LANES)) - 1) as __mmask16;
                let wv = _mm512_maskz_loadu_ps(m, w.add(LANES * h));
                let sv = _mm512_maskz_loadu_ps(m, s.add(LANES * h));
                let at = block.ws[qh].as_mut_ptr().add(LANES * h) as *mut f32;
                _mm512_storeu_ps(at, _mm512_mul_ps(wv, sv));
                let nonzero = _mm512_mask_cmp_ps_mask::<_CMP_NEQ_UQ>(m, wv, _mm512_setzero_ps());
                live[h / 2] |= (nonzero as u32) << (LANES * (h % 2));
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
/// `groups` (of either segment), over the live rows of the block's first `n_chunks` chunks.
///
/// # Safety
/// AVX-512 F/BW/VBMI; `acc` is `[n_qh][d]` with `q0 + NQ <= n_qh`; the groups lie below `d`;
/// the block's live rows are rows of the run, readable `OVERREAD` bytes past their end.
#[allow(clippy::needless_range_loop)]
#[inline(always)]
unsafe fn tile<const NQ: usize, const NG: usize>(
    lookups: &[Lookup; 2],
    groups: &[Group],
    block: &Block,
    n_chunks: usize,
    acc: *mut f32,
    d: usize,
    q0: usize,
) {
    // SAFETY (all accesses): masked accumulator lanes stay inside their rows of acc; group
    // reads stay inside their row plus `OVERREAD` bytes, which the row source guarantees.
    unsafe {
        let mut masks = [0 as __mmask16; NG];
        let mut control = [_mm512_setzero_si512(); NG];
        let mut table = [_mm512_setzero_ps(); NG];
        let mut a = [[_mm512_setzero_ps(); NG]; NQ];
        for g in 0..NG {
            masks[g] = ((1u32 << groups[g].n) - 1) as __mmask16;
            control[g] = lookups[groups[g].seg].control;
            table[g] = lookups[groups[g].seg].table;
            for q in 0..NQ {
                let at = acc.add((q0 + q) * d + groups[g].first);
                a[q][g] = _mm512_maskz_loadu_ps(masks[g], at);
            }
        }
        for c in 0..n_chunks {
            let mut live = block.live[q0 / TILE_Q][c];
            while live != 0 {
                let t = c * CHUNK + live.trailing_zeros() as usize;
                live &= live - 1;
                let row = block.rows[t].assume_init();
                let mut x = [_mm512_setzero_ps(); NG];
                for g in 0..NG {
                    let word = (row.add(groups[g].byte) as *const i64).read_unaligned();
                    let codes = _mm512_multishift_epi64_epi8(control[g], _mm512_set1_epi64(word));
                    x[g] = _mm512_permutexvar_ps(codes, table[g]);
                }
                for q in 0..NQ {
                    let w = _mm512_set1_ps(block.ws[q0 + q][t].assume_init());
                    for g in 0..NG {
                        a[q][g] = _mm512_fmadd_ps(w, x[g], a[q][g]);
                    }
                }
            }
        }
        for g in 0..NG {
            for q in 0..NQ {
                let at = acc.add((q0 + q) * d + groups[g].first);
                _mm512_mask_storeu_ps(at, masks[g], a[q][g]);
            }
        }
    }
}

/// [`tile`] for `nq` heads × `groups.len()` groups (each 1..=4 and 1..=`TILE_Q`).
///
/// # Safety
/// As [`tile`].
#[inline(always)]
unsafe fn tile_of(
    lookups: &[Lookup; 2],
    groups: &[Group],
    (block, n_chunks): (&Block, usize),
    acc: *mut f32,
    d: usize,
    q0: usize,
    nq: usize,
) {
    macro_rules! run {
        ($nq:literal, $ng:literal) => {
            tile::<$nq, $ng>(lookups, groups, block, n_chunks, acc, d, q0)
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

/// `acc[qh][c] += Σ_j (weights[qh·stride + j] · scales[j]) · level_c(code_{j,c})`.
///
/// # Safety
/// [`available`]; shapes as checked by `super::accumulate_codes`; `super::narrow::applies`
/// holds for the layout.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx2,fma,f16c")]
pub(crate) unsafe fn accumulate(r: CodedRows<'_>, weights: &[f32], stride: usize, acc: &mut [f32]) {
    let page_rows = r.scales.len().max(1);
    // SAFETY: forwarded; one page holding every row.
    unsafe { accumulate_pages(&[r.codes], page_rows, r, weights, stride, acc) }
}

/// [`accumulate`] over a run of pages: row `j` is row `j % page_rows` of
/// `pages[j / page_rows]` (`r.codes` is not read); the tables and the group plan are built once
/// per run and each 32-row chunk may span pages.
///
/// # Safety
/// [`available`]; `super::narrow::applies` holds for the layout;
/// `pages.len() <= super::narrow::MAX_PAGES`, they hold the `r.scales.len()` rows; weights and
/// `acc` as checked by `super::accumulate_codes`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx2,fma,f16c")]
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

    // Both segments' groups in channel order, and the tiles that cover them (a tile may hold
    // groups of both segments: each group brings its own control and table).
    // SAFETY: AVX-512F; an empty segment's placeholder table is never read.
    let mut lookups = unsafe { [Lookup::new(0, &[0.0]); 2] };
    let mut groups = [Group::default(); MAX_DIM / LANES + 2];
    let mut n_groups = 0;
    let mut max_end = 0;
    for (i, seg) in segs.iter().enumerate() {
        if seg.len == 0 {
            continue;
        }
        let table = r.levels.table(layout, seg.first);
        // SAFETY: AVX-512F; the levels were checked against the layout (2^width entries).
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
    let mut tiles = [(0usize, 0usize); MAX_DIM / LANES + 2];
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

    let mut pads = Pads::uninit();
    let src = row_source(pages, page_rows, rows, bytes, max_end, OVERREAD, &mut pads);

    let acc = acc.as_mut_ptr();
    // Weights and row addresses are left unset: `stage` writes every row the tiles read
    // (~11 KiB per call not cleared; a one-page call reads 32 rows of it).
    let block = &mut Block {
        ws: [[MaybeUninit::uninit(); BLOCK]; MAX_HEADS],
        rows: [MaybeUninit::uninit(); BLOCK],
        live: [[0; BLOCK / CHUNK]; MAX_HEADS / TILE_Q],
    };
    for b0 in (0..rows).step_by(BLOCK) {
        let nb = (rows - b0).min(BLOCK);
        // SAFETY: AVX-512F; the block's weights and scales exist (checked shapes), n_qh is
        // at most MAX_HEADS (`narrow::applies`).
        unsafe { stage(&src, (weights, stride), r.scales, n_qh, (b0, nb), block) };
        let n_chunks = nb.div_ceil(CHUNK);
        for q0 in (0..n_qh).step_by(TILE_Q) {
            let nq = (n_qh - q0).min(TILE_Q);
            if block.live[q0 / TILE_Q][..n_chunks].iter().all(|&l| l == 0) {
                continue;
            }
            for &(lo, hi) in &tiles[..n_tiles] {
                // SAFETY: AVX-512 VBMI; heads q0..q0 + nq and the groups lie inside acc; live
                // rows are rows of src, readable OVERREAD bytes past their end.
                unsafe { tile_of(&lookups, &groups[lo..hi], (block, n_chunks), acc, d, q0, nq) };
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::{accumulate_as_pages, narrow, scalar};
    use crate::kv_score::for_each_coded_block;
    use crate::test_util::{random_vec, Rng};

    /// The VBMI tile itself (the dispatcher would fall back to the AVX2 tile without VBMI),
    /// bit for bit against the reference: one block, and the same rows as runs of pages.
    #[test]
    fn vbmi_tile_is_bit_exact() {
        if !(super::available() && crate::Isa::Avx512.cpu_supports()) {
            eprintln!("skipped: no avx512vbmi (or avx512 f/bw/vl) on this CPU");
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
            for page_rows in [1usize, 5, 16] {
                // SAFETY: as above.
                let paged = unsafe {
                    accumulate_as_pages(
                        crate::Isa::Avx512,
                        block,
                        rows,
                        page_rows,
                        &weights,
                        stride,
                        &start,
                    )
                };
                assert_eq!(bits(&paged), bits(&want), "pages of {page_rows} {what}");
            }
            ran += 1;
            Ok(())
        })
        .unwrap();
        assert!(ran > 0, "no narrow layout in the parity sweep");
        eprintln!("avx512vbmi: narrow value tile bit-exact on {ran} blocks");
    }

    /// Calls longer than one staged block (256 rows): one page of 600 rows, and runs of 8
    /// pages of 64 and 100 rows, for the presets' value rates at head dims 64 and 128.
    #[test]
    fn vbmi_tile_is_bit_exact_past_one_block() {
        if !(super::available() && crate::Isa::Avx512.cpu_supports()) {
            eprintln!("skipped: no avx512vbmi (or avx512 f/bw/vl) on this CPU");
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
                    // SAFETY: as above.
                    let paged = unsafe {
                        accumulate_as_pages(
                            crate::Isa::Avx512,
                            block,
                            rows,
                            page_rows,
                            &weights,
                            rows,
                            &start,
                        )
                    };
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
