//! The paired AVX-512 scan: two rows per register, VBMI cut and lookup, VNNI sums (the parent
//! module's doc says how and why).

use crate::codes::CodeLayout;
use crate::kv_score::int_dot::{padded, query_len, IntQueries, IntRows, GROUP, MAX_INT_DIM};
use std::arch::x86_64::*;
use std::cell::RefCell;
use std::mem::MaybeUninit;

/// Padded query coordinates per row cut by one gather: 4 groups of 8 consecutive codes.
const SPAN: usize = 32;
/// Rows per block (one vector of 16 scores per head).
const BLOCK: usize = 16;
/// Row pairs per block.
const PAIRS: usize = BLOCK / 2;
/// Bytes of a row loaded once per pair at most (one register); longer rows are loaded per
/// span.
const WHOLE_ROW_BYTES: usize = 64;
/// Spans per row at most: 16-code spans when rows go four to a register (rows of up to 32
/// bytes still reach head dim 256 at 1 bit).
const MAX_SPANS: usize = (MAX_INT_DIM + 2 * GROUP).div_ceil(SPAN / 2);
/// Rows of up to this many bytes go four to a register.
const QUAD_ROW_BYTES: usize = 32;
/// Query heads per pass over the rows (their sums stay in registers).
const HEADS: usize = 4;
/// Added to an int8 level to make it an unsigned byte (zero-extended, no sign fix-up).
pub(super) const BIAS: i32 = 128;

/// Whether this CPU has the byte permutes and multishift (VBMI) and `vpdpbusd` (VNNI).
pub(super) fn cpu_has_vbmi_vnni() -> bool {
    is_x86_feature_detected!("avx512vbmi") && is_x86_feature_detected!("avx512vnni")
}

/// One gather's cut: 32 codes of row A in bytes 0..32, the same 32 of row B in bytes 32..64
/// (padded query coordinates `32z..32z + 32` of span `z`), 8 consecutive codes to a 64-bit
/// lane; after the lookup, each 32-bit lane holds 4 consecutive biased levels of one row.
#[derive(Clone, Copy)]
struct Span {
    /// Byte of the row where the span's load starts (0 when the row is loaded whole).
    at: usize,
    /// The row's bytes from `at`, for a per-span masked load.
    load: u64,
    /// Per byte: the byte of A (0..64) or of B (64..128) the gather puts there — the 8 bytes
    /// from the one where the lane's first code starts (counted from `at`).
    gather: __m512i,
    /// Per byte: the bit of its 64-bit lane where its code starts.
    shift: __m512i,
    /// The bytes whose code is in the first channel group, then the second.
    masks: [u64; 2],
}

/// The layout's part of a scan: built once per thread and layout.
struct Plan {
    layout: CodeLayout,
    spans: Vec<Span>,
    /// The row's bytes, for the masked loads of a whole row.
    row_mask: u64,
    /// Rows of more than 64 bytes: each span loads its own 32 bytes.
    per_span: bool,
    /// Rows of at most 32 bytes: four to a register (16 codes of each per span), one per
    /// 128-bit quarter.
    quad: bool,
}

thread_local! {
    static PLAN: RefCell<Option<Plan>> = const { RefCell::new(None) };
}

/// The bit where padded query coordinate `p`'s code starts, and its channel group; `None`
/// for padding.
pub(super) fn code_bit(layout: &CodeLayout, pad_hi: usize, p: usize) -> Option<(usize, usize)> {
    let (hi, lo) = (layout.hi as usize, layout.lo as usize);
    if p < pad_hi {
        (p < layout.n_hi).then_some((p * hi, 0))
    } else {
        let c = p - pad_hi;
        (c < layout.d - layout.n_hi).then_some((layout.n_hi * hi + c * lo, 1))
    }
}

/// The first `n` bytes of a register (all 64 from `n = 64` on).
pub(super) fn mask_of(n: usize) -> u64 {
    if n >= 64 {
        u64::MAX
    } else {
        (1 << n) - 1
    }
}

impl Plan {
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    fn new(layout: &CodeLayout) -> Self {
        let [pad_hi, _] = padded(layout);
        let bytes = layout.bytes();
        let per_span = bytes > WHOLE_ROW_BYTES;
        let quad = bytes <= QUAD_ROW_BYTES;
        // Rows per register, codes of a row per span.
        let (rows, span) = if quad { (4, SPAN / 2) } else { (2, SPAN) };
        let spans: Vec<Span> = (0..query_len(layout).div_ceil(span))
            .map(|z| {
                let (mut gather, mut shift, mut masks) = ([0u8; 64], [0u8; 64], [0u64; 2]);
                // A span's codes are at most 32 · 4 consecutive bits (a group ends on a byte,
                // the next starts there): 16 bytes and the next from its first code's byte.
                // A per-span load is 32 bytes (the span's 16 and the lanes' 8-byte windows).
                let window = if per_span || quad { 32 } else { 64 };
                let at = if per_span {
                    (0..span)
                        .find_map(|i| code_bit(layout, pad_hi, z * span + i))
                        .map_or(0, |(bit, _)| bit / 8)
                } else {
                    0
                };
                for lane in 0..8 / rows {
                    // 8 codes of one group (groups are padded to 16), at most 8 · 4 + 7 bits
                    // from the first one's byte.
                    let codes: [Option<(usize, usize)>; 8] = core::array::from_fn(|i| {
                        code_bit(layout, pad_hi, z * span + 8 * lane + i)
                    });
                    let start = codes
                        .iter()
                        .flatten()
                        .next()
                        .map_or(at, |&(bit, _)| bit / 8);
                    for slot in 0..rows {
                        for (i, code) in codes.iter().enumerate() {
                            let byte = 64 / rows * slot + 8 * lane + i;
                            // Bytes past the row's end are zeros of the masked load; row `slot`
                            // is at byte 64 · slot of the sources (pairs) or 32 · slot (quads:
                            // two rows per source, one per 256-bit half).
                            let source = 128 / rows * slot;
                            gather[byte] = ((start - at + i).min(window - 1) + source) as u8;
                            if let Some((bit, g)) = *code {
                                shift[byte] = (bit - 8 * start) as u8;
                                masks[g] |= 1 << byte;
                            }
                        }
                    }
                }
                // SAFETY: 64-byte local arrays.
                unsafe {
                    Span {
                        at,
                        load: mask_of(bytes - at),
                        gather: _mm512_loadu_si512(gather.as_ptr() as *const __m512i),
                        shift: _mm512_loadu_si512(shift.as_ptr() as *const __m512i),
                        masks,
                    }
                }
            })
            .collect();
        // The dealt queries' buffer holds MAX_SPANS spans per head.
        assert!(spans.len() <= MAX_SPANS, "int_dot avx512: too many spans");
        Plan {
            layout: *layout,
            spans,
            row_mask: mask_of(bytes),
            per_span,
            quad,
        }
    }
}

/// 0, 1, ..., 63.
static IOTA: [u8; 64] = {
    let mut t = [0u8; 64];
    let mut i = 0;
    while i < 64 {
        t[i] = i as u8;
        i += 1;
    }
    t
};

/// A group's biased levels (`level + 128` as bytes) repeated every `2^width` entries over 64,
/// so the lookup may ignore the bits above the code.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx2,fma,f16c")]
pub(super) fn table(levels: &[i8; 16], width: u32) -> __m512i {
    // SAFETY: a 16-byte array and a 64-byte static.
    let (levels, iota) = unsafe {
        (
            _mm_loadu_si128(levels.as_ptr() as *const __m128i),
            _mm512_loadu_si512(IOTA.as_ptr() as *const __m512i),
        )
    };
    // `level + 128` is `level ^ 0x80` in bytes.
    let biased = _mm512_broadcast_i32x4(_mm_xor_si128(levels, _mm_set1_epi8(i8::MIN)));
    let index = _mm512_and_si512(iota, _mm512_set1_epi8(((1u32 << width) - 1) as i8));
    _mm512_permutexvar_epi8(index, biased)
}

/// Per 128-bit quarter, 4 int32 lanes of `x` and `y` folded to 2 each: `[x0+x2, y0+y2, x1+x3,
/// y1+y3]`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
fn fold32(x: __m512i, y: __m512i) -> __m512i {
    _mm512_add_epi32(_mm512_unpacklo_epi32(x, y), _mm512_unpackhi_epi32(x, y))
}

/// Per 128-bit quarter, two pairs of [`fold32`] results folded to one lane each.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
fn fold64(x: __m512i, y: __m512i) -> __m512i {
    _mm512_add_epi32(_mm512_unpacklo_epi64(x, y), _mm512_unpackhi_epi64(x, y))
}

/// The 16 row sums of a block from its 4 quads' accumulators (quad `i`: row `4k + i` in
/// quarter `k`), in row order: 9 instructions per 16 rows.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
pub(super) fn reduce_quads(acc: &[__m512i]) -> __m512i {
    fold64(fold32(acc[0], acc[1]), fold32(acc[2], acc[3]))
}

/// The 16 row sums of a block from its 8 pairs' accumulators (pair `i`: rows `(i / 4) · 8 +
/// i % 4` in the low half, 4 rows later in the high half), in row order.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
fn reduce(acc: &[__m512i; PAIRS]) -> __m512i {
    // Per 128-bit quarter: one partial of pairs 0..4 (4..8); quarters 0, 1 hold the low rows.
    let first = fold64(fold32(acc[0], acc[1]), fold32(acc[2], acc[3]));
    let second = fold64(fold32(acc[4], acc[5]), fold32(acc[6], acc[7]));
    _mm512_add_epi32(
        _mm512_shuffle_i32x4::<0b10_00_10_00>(first, second),
        _mm512_shuffle_i32x4::<0b11_01_11_01>(first, second),
    )
}

/// # Safety
/// CPU must support AVX-512 F/BW/VL/VBMI/VNNI (+AVX2/FMA/F16C); shapes as
/// checked by `super::super::score_codes_int`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx512vnni,avx2,fma,f16c")]
pub(super) unsafe fn score(r: IntRows<'_>, queries: IntQueries<'_>, scores: &mut [f32], stride: usize) {
    if r.scales.is_empty() || queries.n_qh == 0 {
        return;
    }
    PLAN.with(|cell| {
        let mut cell = cell.borrow_mut();
        if cell.as_ref().is_none_or(|plan| plan.layout != *r.layout) {
            // The closure runs with this function's target features.
            *cell = Some(Plan::new(r.layout));
        }
        let plan = cell.as_ref().expect("plan just built");
        // SAFETY: as the caller vouches; the plan is the layout's.
        unsafe { score_planned(plan, r, queries, scores, stride) }
    })
}

/// # Safety
/// As [`score`]; `plan` made for `r.layout`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx512vnni,avx2,fma,f16c")]
unsafe fn score_planned(
    plan: &Plan,
    r: IntRows<'_>,
    queries: IntQueries<'_>,
    scores: &mut [f32],
    stride: usize,
) {
    let tables = [
        table(&r.levels.hi, r.layout.hi),
        table(&r.levels.lo, r.layout.lo),
    ];
    let mut h0 = 0;
    macro_rules! go {
        ($h:expr, $per_span:expr, $quad:expr) => {
            pass::<$h, $per_span, $quad>(plan, &tables, r, queries, h0, scores, stride)
        };
    }
    while h0 < queries.n_qh {
        let heads = (queries.n_qh - h0).min(HEADS);
        // SAFETY: as the caller vouches; heads h0..h0 + heads exist.
        unsafe {
            match (heads, plan.per_span, plan.quad) {
                (1, false, true) => go!(1, false, true),
                (2, false, true) => go!(2, false, true),
                (3, false, true) => go!(3, false, true),
                (_, false, true) => go!(HEADS, false, true),
                (1, false, _) => go!(1, false, false),
                (2, false, _) => go!(2, false, false),
                (3, false, _) => go!(3, false, false),
                (_, false, _) => go!(HEADS, false, false),
                (1, true, _) => go!(1, true, false),
                (2, true, _) => go!(2, true, false),
                (3, true, _) => go!(3, true, false),
                (_, true, _) => go!(HEADS, true, false),
            }
        }
        h0 += heads;
    }
}

/// Scores every row for query heads `h0..h0 + H`; `r.scales` is not empty; `PER_SPAN` and
/// `QUAD` are the plan's.
///
/// # Safety
/// As [`score_planned`].
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx512vnni,avx2,fma,f16c")]
unsafe fn pass<const H: usize, const PER_SPAN: bool, const QUAD: bool>(
    plan: &Plan,
    tables: &[__m512i; 2],
    r: IntRows<'_>,
    queries: IntQueries<'_>,
    h0: usize,
    scores: &mut [f32],
    stride: usize,
) {
    let len = query_len(r.layout);
    let spans = plan.spans.as_slice();
    let span_len = if QUAD { SPAN / 2 } else { SPAN };
    // Each head's query as the lanes hold it: per span, its int8 coordinates repeated in
    // every row's part of a register (span z, head h at z · H + h); and the bias its sums
    // carry.
    let mut dealt = MaybeUninit::<[__m512i; HEADS * MAX_SPANS]>::uninit();
    let dealt = dealt.as_mut_ptr() as *mut __m512i;
    let mut bias = [0i32; H];
    for (h, bias) in bias.iter_mut().enumerate() {
        let q = queries.head(h0 + h, len);
        // The padding is zeros, so this is the sum over the lanes.
        *bias = BIAS * q.iter().map(|&v| v as i32).sum::<i32>();
        for z in 0..spans.len() {
            let mask = ((1u64 << (len - z * span_len).min(span_len)) - 1) as __mmask32;
            // SAFETY: the masked lanes lie inside the query (len int16s); z · H + h is inside
            // `dealt` (H ≤ HEADS, spans ≤ MAX_SPANS).
            unsafe {
                let v = _mm512_maskz_loadu_epi16(mask, q.as_ptr().add(z * span_len));
                // The int16s hold int8 values (`QUERY_MAX`), so truncating them is exact.
                let bytes = _mm512_cvtepi16_epi8(v);
                let repeated = if QUAD {
                    _mm512_broadcast_i32x4(_mm256_castsi256_si128(bytes))
                } else {
                    _mm512_broadcast_i64x4(bytes)
                };
                dealt.add(z * H + h).write(repeated);
            }
        }
    }
    let dealt = dealt as *const __m512i;
    let bytes = r.layout.bytes();
    let rows = r.scales.len();
    let mut sums = [[_mm512_setzero_si512(); PAIRS]; H];
    // The next row, and how many rows its page has left from it.
    let (mut page, mut row, mut left) = (0usize, r.pages[0].as_ptr(), r.page_rows);
    for j0 in (0..rows).step_by(BLOCK) {
        let nb = (rows - j0).min(BLOCK);
        let mut at = [row; BLOCK];
        for at in &mut at[..nb] {
            if left == 0 {
                page += 1;
                (row, left) = (r.pages[page].as_ptr(), r.page_rows);
            }
            *at = row;
            row = row.wrapping_add(bytes);
            left -= 1;
        }
        // Rows past the block's end load the first row again; their scores are not stored.
        let first = at[0];
        at[nb..].fill(first);
        // Pairs: rows `low` and `low + 4`; quads: rows `i + 4k`, k = 0..4.
        for i in 0..if QUAD { BLOCK / 4 } else { PAIRS } {
            let low = if QUAD { i } else { (i / 4) * 8 + i % 4 };
            if low >= nb {
                for s in sums.iter_mut() {
                    s[i] = _mm512_setzero_si512();
                }
                continue;
            }
            let (row_a, row_b) = (at[low], at[low + 4]);
            // SAFETY: both rows are whole rows inside their pages (shapes checked by the
            // caller), read only up to their `bytes`.
            let (mut a, mut b) = if QUAD {
                // SAFETY: as above.
                unsafe {
                    let load = |row: *const u8| {
                        _mm256_maskz_loadu_epi8(plan.row_mask as __mmask32, row as *const i8)
                    };
                    let two = |x: *const u8, y: *const u8| {
                        _mm512_inserti64x4::<1>(_mm512_zextsi256_si512(load(x)), load(y))
                    };
                    (two(at[i], at[i + 4]), two(at[i + 8], at[i + 12]))
                }
            } else if PER_SPAN {
                (_mm512_setzero_si512(), _mm512_setzero_si512())
            } else {
                unsafe {
                    // A 256-bit load where the row fits one (measured ~5 % faster at d 64).
                    if plan.row_mask >> 32 == 0 {
                        let load = |row: *const u8| {
                            _mm512_zextsi256_si512(_mm256_maskz_loadu_epi8(
                                plan.row_mask as __mmask32,
                                row as *const i8,
                            ))
                        };
                        (load(row_a), load(row_b))
                    } else {
                        (
                            _mm512_maskz_loadu_epi8(plan.row_mask, row_a as *const i8),
                            _mm512_maskz_loadu_epi8(plan.row_mask, row_b as *const i8),
                        )
                    }
                }
            };
            let mut acc = [_mm512_setzero_si512(); H];
            for (z, span) in spans.iter().enumerate() {
                if PER_SPAN {
                    // SAFETY: `at` is inside the row, `load` stops at its end.
                    unsafe {
                        let load = |row: *const u8| {
                            _mm512_zextsi256_si512(_mm256_maskz_loadu_epi8(
                                span.load as __mmask32,
                                row.add(span.at) as *const i8,
                            ))
                        };
                        (a, b) = (load(row_a), load(row_b));
                    }
                }
                let code = _mm512_multishift_epi64_epi8(
                    span.shift,
                    _mm512_permutex2var_epi8(a, span.gather, b),
                );
                let levels = if span.masks[0] != 0 {
                    let first = _mm512_maskz_permutexvar_epi8(span.masks[0], code, tables[0]);
                    if span.masks[1] != 0 {
                        _mm512_mask_permutexvar_epi8(first, span.masks[1], code, tables[1])
                    } else {
                        first
                    }
                } else {
                    _mm512_maskz_permutexvar_epi8(span.masks[1], code, tables[1])
                };
                for (h, acc) in acc.iter_mut().enumerate() {
                    // SAFETY: span z of head h lies inside `dealt` (written above).
                    unsafe { *acc = _mm512_dpbusd_epi32(*acc, levels, *dealt.add(z * H + h)) };
                }
            }
            for (s, a) in sums.iter_mut().zip(acc) {
                s[i] = a;
            }
        }
        let mask = ((1u32 << nb) - 1) as __mmask16;
        // SAFETY: rows j0..j0 + nb have scales; masked lanes stay inside.
        let scale = unsafe { _mm512_maskz_loadu_ps(mask, r.scales.as_ptr().add(j0)) };
        for (h, s) in sums.iter().enumerate() {
            // Wrapping int32 sums: exact once the bias is off, whatever the order.
            let sum = if QUAD { reduce_quads(s) } else { reduce(s) };
            let sum = _mm512_sub_epi32(sum, _mm512_set1_epi32(bias[h]));
            let factor = _mm512_set1_ps(queries.factor(h0 + h));
            // The reference's `(factor · sum) · scale`, unfused.
            let out = _mm512_mul_ps(_mm512_mul_ps(factor, _mm512_cvtepi32_ps(sum)), scale);
            let at = (h0 + h) * stride + j0;
            // SAFETY: the nb scores from `at` lie inside `scores` (stride ≥ rows, checked).
            unsafe { _mm512_mask_storeu_ps(scores.as_mut_ptr().add(at), mask, out) };
        }
        crate::prefetch::pump_rows_avx512(nb);
    }
}
