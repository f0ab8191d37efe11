//! Key scores in integer arithmetic, straight from the packed codes: the rotated query is
//! quantised once per step and head to 7 bits (one scale per head; stored as int16s), the
//! codebook levels once per codec to int8 (one scale shared by both channel groups), and a
//! token's score is `(factor · Σ_c q_c · level_c(code_c)) · scale_j` with the sum in int32.
//!
//! Integer sums are exact in any order, so every ISA returns the same bits as the scalar
//! reference by construction: the SIMD versions may reorder the sum freely; the float epilogue
//! (int → f32, two multiplies, no fused multiply-add) is the same operation sequence everywhere.
//!
//! What it supports: code widths up to 4 bits (a level table fits one 16-byte byte shuffle —
//! `vpshufb` on AVX2, `tbl` on NEON, `i8x16.swizzle` on SIMD128), a second channel group that
//! starts on a byte (`CodeLayout::segments`), head dims up to [`MAX_INT_DIM`] (the int32 sum
//! cannot overflow: 256 · 255 · 127 < 2^31, the biased levels included). Other layouts keep
//! the float scan.
//!
//! Query layout: per head, [`query_len`] int16s — group 0's channels padded with zeros to a
//! multiple of 16, then group 1's likewise, so kernels work on whole groups of 16 codes (the
//! codes past a group's end meet a zero query).

crate::isa::isa_modules!(scalar, avx2, avx512, quad);

use crate::codes::{CodeLayout, Levels};
use crate::isa::{active_isa, dispatch, Isa};

/// Largest head dim of the integer scan.
pub const MAX_INT_DIM: usize = 256;
/// Largest code width of the integer scan (levels through one 16-entry byte table).
pub const MAX_INT_WIDTH: u32 = 4;
/// Integer range of a quantised query coordinate: 7 bits, so AVX2 multiplies a run's level
/// bytes (unsigned, up to 255) by it in `vpmaddubsw` without saturating an int16 pair
/// (2 · 255 · 63 < 2^15); AVX-512 VNNI takes it as int8 (`vpdpbusd`), the other ISAs in int16
/// lanes.
pub(crate) const QUERY_MAX: f32 = 63.0;
const _: () = assert!(2.0 * 255.0 * QUERY_MAX <= i16::MAX as f32);
/// Integer range of a quantised level.
const LEVEL_MAX: f32 = 127.0;
/// Codes per kernel group (one 256-bit register of int16 lanes).
pub(crate) const GROUP: usize = 16;

/// Whether `layout` can be scored in integers.
pub fn supports(layout: &CodeLayout) -> bool {
    layout.segments().is_some()
        && layout.hi <= MAX_INT_WIDTH
        && layout.lo <= MAX_INT_WIDTH
        && layout.d > 0
        && layout.d <= MAX_INT_DIM
}

/// The two channel groups' padded lengths in the query (multiples of [`GROUP`]).
pub(crate) fn padded(layout: &CodeLayout) -> [usize; 2] {
    [
        layout.n_hi.next_multiple_of(GROUP),
        (layout.d - layout.n_hi).next_multiple_of(GROUP),
    ]
}

/// Int16s of one head's quantised query.
pub fn query_len(layout: &CodeLayout) -> usize {
    let [a, b] = padded(layout);
    a + b
}

/// The int8 levels of a layout's two codebooks and the scale they share: level `v` of group
/// `g` stands for `scale · table[g][v]`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct IntLevels {
    pub hi: [i8; 16],
    pub lo: [i8; 16],
    pub scale: f32,
}

impl IntLevels {
    /// `None` when the layout is not [`supports`]ed or a level is not finite.
    pub fn new(layout: &CodeLayout, levels: Levels<'_>) -> Option<Self> {
        if !supports(layout) {
            return None;
        }
        levels.check(layout);
        let used = |table: &[f32], bits: u32, present: bool| -> Vec<f32> {
            if present {
                table[..1 << bits].to_vec()
            } else {
                Vec::new()
            }
        };
        let hi = used(levels.hi, layout.hi, layout.n_hi > 0);
        let lo = used(levels.lo, layout.lo, layout.n_hi < layout.d);
        if hi.iter().chain(&lo).any(|v| !v.is_finite()) {
            return None;
        }
        let max = hi.iter().chain(&lo).fold(0.0f32, |m, v| m.max(v.abs()));
        let scale = if max > 0.0 { max / LEVEL_MAX } else { 1.0 };
        let quantise = |values: &[f32]| {
            let mut table = [0i8; 16];
            for (t, v) in table.iter_mut().zip(values) {
                *t = (v / scale).round().clamp(-LEVEL_MAX, LEVEL_MAX) as i8;
            }
            table
        };
        Some(IntLevels {
            hi: quantise(&hi),
            lo: quantise(&lo),
            scale,
        })
    }
}

/// Quantises one head's query `q` (`layout.d` floats, already rotated and scaled) into `out`
/// ([`query_len`] int16s, padding zeroed); returns the factor that turns this head's integer
/// sums into scores (the query scale times the levels' scale). A zero or non-finite query
/// gives zeros and factor 0.
pub fn quantize_query(layout: &CodeLayout, levels: &IntLevels, q: &[f32], out: &mut [i16]) -> f32 {
    assert_eq!(q.len(), layout.d, "quantize_query: q is not [d]");
    assert_eq!(
        out.len(),
        query_len(layout),
        "quantize_query: out is not [query_len]"
    );
    out.fill(0);
    let max = q.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    if !(max > 0.0 && max.is_finite()) {
        return 0.0;
    }
    let inv = QUERY_MAX / max;
    let [pad_hi, _] = padded(layout);
    let (hi, lo) = q.split_at(layout.n_hi);
    for (o, v) in out.iter_mut().zip(hi) {
        *o = query_code(v * inv);
    }
    for (o, v) in out[pad_hi..].iter_mut().zip(lo) {
        *o = query_code(v * inv);
    }
    (max / QUERY_MAX) * levels.scale
}

/// `x.round().clamp(-QUERY_MAX, QUERY_MAX) as i16` for finite `|x| < 2^22`, in operations that
/// vectorize ([`crate::round`]): on baseline x86-64 `round` is a library call per coordinate
/// (5 % of a decode attention's samples at depth 512).
#[inline(always)]
fn query_code(x: f32) -> i16 {
    use crate::round::{round_even, round_even_int};
    let nearest = round_even(x);
    // At a tie `round` takes the neighbour away from zero; x ± 0.5 is that integer, exactly.
    let rounded = if (x - nearest).abs() == 0.5 {
        x + 0.5f32.copysign(x)
    } else {
        nearest
    };
    // Clamping an integer to integer bounds keeps it an integer.
    round_even_int(rounded.clamp(-QUERY_MAX, QUERY_MAX)) as i16
}

/// A run of packed key rows for the integer scan: `scales.len()` rows of `layout.bytes()`,
/// `page_rows` to a slice of `pages` (row `j` is row `j % page_rows` of
/// `pages[j / page_rows]`). A run of several pages is scanned in one call, so the kernel's
/// set-up and dispatch are paid per run, not per page; a single block is one page of
/// `scales.len()` rows ([`IntRows::block`]).
#[derive(Clone, Copy)]
pub struct IntRows<'a> {
    pub pages: &'a [&'a [u8]],
    pub page_rows: usize,
    pub layout: &'a CodeLayout,
    pub levels: &'a IntLevels,
    pub scales: &'a [f32],
}

impl<'a> IntRows<'a> {
    /// One contiguous block: `codes` holds all `scales.len()` rows.
    pub fn block(
        codes: &'a &'a [u8],
        layout: &'a CodeLayout,
        levels: &'a IntLevels,
        scales: &'a [f32],
    ) -> Self {
        IntRows {
            pages: core::slice::from_ref(codes),
            page_rows: scales.len().max(1),
            layout,
            levels,
            scales,
        }
    }

    /// The packed bytes of row `j`.
    #[inline(always)]
    pub(crate) fn row(&self, j: usize) -> &'a [u8] {
        let bytes = self.layout.bytes();
        let at = (j % self.page_rows) * bytes;
        &self.pages[j / self.page_rows][at..at + bytes]
    }
}

/// Quantised queries of `n_qh` heads: head `h`'s int16s at `values[h · value_stride..]`
/// ([`query_len`] of them), its factor at `factors[h · factor_stride]`.
#[derive(Clone, Copy)]
pub struct IntQueries<'a> {
    pub n_qh: usize,
    pub values: &'a [i16],
    pub value_stride: usize,
    pub factors: &'a [f32],
    pub factor_stride: usize,
}

impl IntQueries<'_> {
    #[inline(always)]
    pub(crate) fn head(&self, h: usize, len: usize) -> &[i16] {
        &self.values[h * self.value_stride..][..len]
    }

    #[inline(always)]
    pub(crate) fn factor(&self, h: usize) -> f32 {
        self.factors[h * self.factor_stride]
    }
}

/// The score of a row from its integer sum: the one float sequence every ISA follows.
#[inline(always)]
pub(crate) fn epilogue(factor: f32, sum: i32, scale: f32) -> f32 {
    (factor * sum as f32) * scale
}

/// A row's `layout.d` codes as levels in the query's padded layout: channel `c < n_hi` at `c`
/// from `hi`, the others from the second group's padded start on from `lo`; padding is left as
/// it is.
#[inline(always)]
pub(crate) fn place_levels<T: Copy>(
    layout: &CodeLayout,
    codes: &[u8],
    hi: &[T; 16],
    lo: &[T; 16],
    row: &mut [T],
) {
    let (d, n_hi) = (layout.d, layout.n_hi);
    let [pad_hi, _] = padded(layout);
    let (hi_codes, lo_codes) = codes[..d].split_at(n_hi);
    for (level, &code) in row[..n_hi].iter_mut().zip(hi_codes) {
        *level = hi[code as usize & 15];
    }
    for (level, &code) in row[pad_hi..pad_hi + d - n_hi].iter_mut().zip(lo_codes) {
        *level = lo[code as usize & 15];
    }
}

/// The row loop of the scalar and 4-lane versions: `unpack(row_bytes, codes)` gives a row's
/// codes, the tables its levels in the query's padded layout, then one int32 dot product per
/// query head.
#[inline(always)]
pub(crate) fn score_unpacked_rows(
    r: IntRows<'_>,
    queries: IntQueries<'_>,
    scores: &mut [f32],
    stride: usize,
    unpack: impl Fn(&[u8], &mut [u8]),
) {
    let layout = r.layout;
    let len = query_len(layout);
    let (hi, lo) = (r.levels.hi.map(i16::from), r.levels.lo.map(i16::from));
    let mut codes = [0u8; MAX_INT_DIM];
    let codes = &mut codes[..layout.d];
    // The row's levels in the query's padded layout (padding stays zero).
    let mut row = [0i16; MAX_INT_DIM + 2 * GROUP];
    let row = &mut row[..len];
    for (j, &scale) in r.scales.iter().enumerate() {
        if j % 16 == 0 {
            crate::prefetch::pump_rows(16);
        }
        unpack(r.row(j), codes);
        place_levels(layout, codes, &hi, &lo, row);
        for h in 0..queries.n_qh {
            let q = queries.head(h, len);
            let sum: i32 = q
                .iter()
                .zip(row.iter())
                .map(|(&a, &b)| a as i32 * b as i32)
                .sum();
            scores[h * stride + j] = epilogue(queries.factor(h), sum, scale);
        }
    }
}

/// `scores[h·stride + j] = (factor_h · Σ_c q_h[c] · level_c(code_{j,c})) · scales[j]` in
/// integers (see the module doc) for the `rows.scales.len()` rows and every query head.
pub fn score_codes_int(
    rows: IntRows<'_>,
    queries: IntQueries<'_>,
    scores: &mut [f32],
    stride: usize,
) {
    let layout = rows.layout;
    assert!(supports(layout), "score_codes_int: layout not supported");
    let n = rows.scales.len();
    assert!(rows.page_rows > 0, "score_codes_int: empty pages");
    assert!(
        rows.pages.len() >= n.div_ceil(rows.page_rows),
        "score_codes_int: fewer pages than the rows"
    );
    for (p, page) in rows
        .pages
        .iter()
        .enumerate()
        .take(n.div_ceil(rows.page_rows))
    {
        let in_page = (n - p * rows.page_rows).min(rows.page_rows);
        assert!(
            page.len() >= in_page * layout.bytes(),
            "score_codes_int: codes shorter than the rows"
        );
    }
    assert!(n <= stride, "score_codes_int: more rows than the stride");
    let len = query_len(layout);
    let n_qh = queries.n_qh;
    if n_qh > 0 {
        assert!(
            queries.values.len() >= (n_qh - 1) * queries.value_stride + len,
            "score_codes_int: queries shorter than [n_qh][query_len]"
        );
        assert!(
            queries.factors.len() > (n_qh - 1) * queries.factor_stride,
            "score_codes_int: factors shorter than [n_qh]"
        );
        assert!(
            scores.len() >= (n_qh - 1) * stride + n,
            "score_codes_int: scores shorter than [n_qh][stride]"
        );
    }
    // SAFETY: active_isa() only returns ISAs validated against this CPU; shapes checked.
    unsafe { score_codes_int_on(active_isa(), rows, queries, scores, stride) }
}

/// # Safety
/// `isa` must run on this CPU; shapes as checked by [`score_codes_int`].
pub(crate) unsafe fn score_codes_int_on(
    isa: Isa,
    rows: IntRows<'_>,
    queries: IntQueries<'_>,
    scores: &mut [f32],
    stride: usize,
) {
    dispatch!(isa, score_codes_int(rows, queries, scores, stride))
}

#[cfg(any(test, feature = "parity"))]
pub(crate) fn parity(isa: Isa) -> crate::test_util::Check {
    use crate::test_util::*;
    let mut rng = Rng::new(23);
    let stride = 37;
    let mut layouts: Vec<CodeLayout> = super::parity_layouts()
        .into_iter()
        .filter(supports)
        .collect();
    // Every width pair the integer scan takes, at a dim with ragged groups (40 / 24) and at
    // the AVX2 wide scan's shape (groups of whole 32-code runs); then a 3-run row, one group
    // only, the largest head dim.
    for (d, n_hi) in [(40, 24), (64, 32)] {
        for hi in 1..=4u32 {
            for lo in 1..=4u32 {
                layouts.push(CodeLayout { d, n_hi, hi, lo });
            }
        }
    }
    layouts.extend([
        CodeLayout {
            d: 96,
            n_hi: 64,
            hi: 4,
            lo: 3,
        },
        CodeLayout::uniform(64, 4),
        CodeLayout::uniform(128, 3),
        CodeLayout::for_half_bits(MAX_INT_DIM, 7),
        CodeLayout::for_half_bits(MAX_INT_DIM, 5),
        // The AVX-512 scan's edges: a 32-code span holding both groups, a 64-byte row (one
        // whole register), the most spans (d 256 at 1 bit: 32-byte rows, four to a register).
        CodeLayout {
            d: 48,
            n_hi: 16,
            hi: 4,
            lo: 3,
        },
        CodeLayout::uniform(MAX_INT_DIM, 2),
        CodeLayout::uniform(MAX_INT_DIM, 1),
    ]);
    for (i, layout) in layouts.into_iter().enumerate() {
        // Past 16 heads AVX-512 lays the run out once (`avx512::heads`): a head count that
        // leaves a partial group of eight, and a run that ends in a partial block. AVX2 takes
        // heads in passes of 8, then 4, then the rest: 14 is one of each.
        for (n_qh, rows) in [
            (1usize, 1usize),
            (3, 32),
            (9, 37),
            (4, 17),
            (14, 20),
            (19, 30),
            (32, 16),
        ] {
            let (packed, mut hi, mut lo) = super::random_block(&mut rng, &layout, rows);
            // Every other layout with levels of both signs (the int8 range's both ends).
            if i % 2 == 1 {
                hi.iter_mut().chain(lo.iter_mut()).for_each(|v| *v -= 0.15);
            }
            let levels = IntLevels::new(&layout, Levels { hi: &hi, lo: &lo }).expect("supported");
            let scales: Vec<f32> = (0..rows).map(|_| 1.0 + rng.uniform()).collect();
            let len = query_len(&layout);
            // Heads a little further apart than their length, as the codecs store them.
            let value_stride = len + 6;
            let mut values = vec![0i16; n_qh * value_stride];
            let mut factors = vec![0.0f32; 2 * n_qh];
            for h in 0..n_qh {
                let q = random_vec(rng.next_u64(), layout.d);
                factors[2 * h] =
                    quantize_query(&layout, &levels, &q, &mut values[h * value_stride..][..len]);
            }
            let queries = IntQueries {
                n_qh,
                values: &values,
                value_stride,
                factors: &factors,
                factor_stride: 2,
            };
            let packed_ref = packed.as_slice();
            let block = IntRows::block(&packed_ref, &layout, &levels, &scales);
            let mut want = vec![7.0f32; n_qh * stride];
            let mut got = want.clone();
            scalar::score_codes_int(block, queries, &mut want, stride);
            // SAFETY: `isa` comes from the runnable list.
            unsafe { score_codes_int_on(isa, block, queries, &mut got, stride) };
            identical(&got, &want, &|| {
                format!(
                    "score_codes_int d={} {}/{}x{} n_qh={n_qh} rows={rows}",
                    layout.d, layout.hi, layout.lo, layout.n_hi
                )
            })?;
            // The same rows as a run of separately stored pages (ragged against the AVX2
            // kernel's 8-row blocks): the same bits as the one block.
            for page_rows in [5usize, 8, 16, 32] {
                let copies: Vec<Vec<u8>> = packed
                    .chunks(page_rows * layout.bytes())
                    .map(<[u8]>::to_vec)
                    .collect();
                let pages: Vec<&[u8]> = copies.iter().map(Vec::as_slice).collect();
                let run = IntRows {
                    pages: &pages,
                    page_rows,
                    ..block
                };
                let mut paged = vec![7.0f32; n_qh * stride];
                // SAFETY: `isa` comes from the runnable list.
                unsafe { score_codes_int_on(isa, run, queries, &mut paged, stride) };
                identical(&paged, &want, &|| {
                    format!(
                        "score_codes_int pages of {page_rows} d={} {}/{}x{} n_qh={n_qh} rows={rows}",
                        layout.d, layout.hi, layout.lo, layout.n_hi
                    )
                })?;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_util::{random_vec, Rng};

    /// `query_code` is `round` (ties away from zero), clamped: every half step in range and
    /// beyond, the values just either side of each tie, and random ones.
    #[test]
    fn query_code_rounds_as_round_does() {
        let reference = |x: f32| x.round().clamp(-QUERY_MAX, QUERY_MAX) as i16;
        let mut xs = Vec::new();
        for k in -600..=600 {
            let x = k as f32 * 0.5;
            xs.extend([x, x.next_up(), x.next_down()]);
        }
        xs.extend(random_vec(11, 10_000).iter().map(|v| v * 200.0));
        xs.extend([0.0, -0.0, 0.49999997, -0.49999997, 1e-30, -1e-30, 4e6, -4e6]);
        for x in xs {
            assert_eq!(query_code(x), reference(x), "x = {x:e}");
        }
    }

    /// The integer score stays within the quantisation steps of the float score it stands
    /// for: 7-bit query (relative step 1/63 of its largest coordinate) and int8 levels
    /// (half a step of 1/127 of the largest level).
    #[test]
    fn integer_scores_track_the_float_scores() {
        let mut rng = Rng::new(4);
        for layout in [
            CodeLayout::for_half_bits(64, 7),
            CodeLayout::for_half_bits(64, 6),
            CodeLayout::for_half_bits(128, 5),
            CodeLayout::for_half_bits(64, 4),
        ] {
            let rows = 32;
            let (packed, hi, lo) = super::super::random_block(&mut rng, &layout, rows);
            let float_levels = Levels { hi: &hi, lo: &lo };
            let levels = IntLevels::new(&layout, float_levels).unwrap();
            let scales: Vec<f32> = (0..rows).map(|_| 1.0 + rng.uniform()).collect();
            let q = random_vec(rng.next_u64(), layout.d);
            let mut values = vec![0i16; query_len(&layout)];
            let factor = quantize_query(&layout, &levels, &q, &mut values);
            let queries = IntQueries {
                n_qh: 1,
                values: &values,
                value_stride: values.len(),
                factors: &[factor],
                factor_stride: 1,
            };
            let packed_ref = packed.as_slice();
            let block = IntRows::block(&packed_ref, &layout, &levels, &scales);
            let mut got = vec![0.0f32; rows];
            score_codes_int(block, queries, &mut got, rows);
            let mut want = vec![0.0f32; rows];
            crate::kv_score::score_codes(
                &packed,
                &layout,
                float_levels,
                &scales,
                &q,
                &mut want,
                rows,
            );
            let q_max = q.iter().fold(0.0f32, |m, v| m.max(v.abs()));
            let bound_per_channel = levels.scale * 0.5 * q_max + 0.3 * q_max / QUERY_MAX * 0.5;
            for j in 0..rows {
                let bound = 2.0 * scales[j] * layout.d as f32 * bound_per_channel;
                assert!(
                    (got[j] - want[j]).abs() <= bound,
                    "{layout:?} row {j}: {} vs {} (bound {bound})",
                    got[j],
                    want[j]
                );
            }
        }
    }

    #[test]
    fn unsupported_layouts_are_refused() {
        let levels = vec![0.1f32; 256];
        let levels = Levels {
            hi: &levels,
            lo: &levels,
        };
        assert!(IntLevels::new(&CodeLayout::uniform(64, 5), levels).is_none());
        assert!(IntLevels::new(&CodeLayout::for_half_bits(300, 6), levels).is_none());
        // 3.5 bits at d = 40: the 4-bit group ends on a byte, so it is supported.
        assert!(IntLevels::new(&CodeLayout::for_half_bits(40, 7), levels).is_some());
    }
}
