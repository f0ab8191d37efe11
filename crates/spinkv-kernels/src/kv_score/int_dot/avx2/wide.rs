//! The wide integer scan: 32 codes per load, levels as biased bytes multiplied as bytes
//! (`vpmaddubsw`), rows kept in registers (the parent module's doc says how and why).

use super::{reduce8, BLOCK};
use crate::codes::CodeLayout;
use crate::kv_score::int_dot::{padded, query_len, IntLevels, IntQueries, IntRows, MAX_INT_DIM};
use crate::simd::avx2::tail_mask;
use std::arch::x86_64::*;
use std::mem::MaybeUninit;

/// Codes per run: one 16-byte load, one register of 32 level bytes.
const RUN: usize = 32;
/// Runs per row at most.
const MAX_RUNS: usize = MAX_INT_DIM / RUN;
/// Query heads per pass over the rows at most (their row sums go to a block buffer): 8 decode
/// a row once for 8 heads' products, which the `vpmaddwd`s take from memory; prefill's 192
/// query heads a KV head scanned a K3.5 row-head in 1.72 ns against 1.90 with passes of 4
/// (one thread, AMD EPYC Zen 3).
const HEADS: usize = 8;
/// Added to an int8 level to make it an unsigned byte (zero-extended, no sign fix-up).
const BIAS: i32 = 128;

/// Which code of its run a decoded lane holds: `lane` 0..16 of the first register, 16..32
/// of the second.
const fn code_of_lane(nibbles: bool, lane: usize) -> usize {
    let (second, i) = (lane / 16, lane % 16);
    if nibbles {
        // Byte k's low nibble is code 2k, its high nibble code 2k + 1; the low 128-bit half
        // takes low nibbles, the high half high nibbles; the first register bytes 0..8, the
        // second bytes 8..16.
        16 * second + 2 * (i % 8) + i / 8
    } else {
        // 64-bit lane q of register r holds codes 4r + q + 8m, m = 0..4: codes that sit at
        // one bit offset of their byte, so one shift serves the lane.
        4 * second + i / 4 + 8 * (i % 4)
    }
}

/// A shifted cut's byte shuffles and 64-bit lane shifts, per output register.
type ShiftedCut = ([[u8; 32]; 2], [[u64; 4]; 2]);

/// The shifted cut of `w`-bit codes: per output register, the byte shuffle that gives each
/// code's byte (and the next one when the code crosses into it; `0x80` zeroes it otherwise)
/// a 16-bit lane, and each 64-bit lane's shift.
const fn shifted_cut(w: usize) -> ShiftedCut {
    let (mut ctrl, mut shifts) = ([[0x80u8; 32]; 2], [[0u64; 4]; 2]);
    let mut lane = 0;
    while lane < RUN {
        let (r, i) = (lane / 16, lane % 16);
        let bit = w * code_of_lane(false, lane);
        // Lane i is bytes 2i, 2i + 1 of the register; the shuffle works per 128-bit half,
        // both halves holding the same 16 loaded bytes.
        ctrl[r][2 * i] = (bit / 8) as u8;
        if bit % 8 + w > 8 {
            ctrl[r][2 * i + 1] = (bit / 8 + 1) as u8;
        }
        shifts[r][i / 4] = (bit % 8) as u64;
        lane += 1;
    }
    (ctrl, shifts)
}

/// [`shifted_cut`] of widths 1..=3 (index = width; 0 unused).
static SHIFTED: [ShiftedCut; 4] = {
    let mut t: [ShiftedCut; 4] = [([[0u8; 32]; 2], [[0u64; 4]; 2]); 4];
    let mut w = 1;
    while w <= 3 {
        t[w] = shifted_cut(w);
        w += 1;
    }
    t
};

/// One channel group's cut.
#[derive(Clone, Copy)]
struct GroupCut {
    /// 4-bit codes: split by nibble; otherwise shuffled into 16-bit lanes and shifted.
    nibbles: bool,
    /// The group's runs: `runs[first..end]` of the plan.
    first: usize,
    end: usize,
    /// The biased levels (`level + 128` as bytes) in both 128-bit halves.
    table: __m256i,
    /// 64-bit lane shifts: the nibble cut's `[0, 0, 4, 4]`, the shifted cut's per register.
    shifts: [__m256i; 2],
    /// The nibble cut's `0x0f` bytes, the shifted cut's `2^w - 1` words.
    mask: __m256i,
}

/// 32 codes of one group.
#[derive(Clone, Copy)]
struct Run {
    /// Byte of the row where the run's 16-byte load starts (inside the row).
    at: usize,
    /// The shifted cut's byte shuffles, one per output register.
    ctrl: [__m256i; 2],
}

/// A layout's wide scan.
pub(super) struct WidePlan {
    groups: [GroupCut; 2],
    runs: [Run; MAX_RUNS],
    /// Where each run's codes start in the padded query.
    query_at: [usize; MAX_RUNS],
}

impl WidePlan {
    /// `None` unless both groups are whole runs of 32 codes and a row has 16 bytes.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) fn new(layout: &CodeLayout, levels: &IntLevels) -> Option<Self> {
        let bytes = layout.bytes();
        let lens = [layout.n_hi, layout.d - layout.n_hi];
        if bytes < 16 || lens.iter().any(|n| n % RUN != 0) || layout.segments().is_none() {
            return None;
        }
        let [pad_hi, _] = padded(layout);
        let widths = [layout.hi as usize, layout.lo as usize];
        let tables = [&levels.hi, &levels.lo];
        let zero = _mm256_setzero_si256();
        let mut plan = WidePlan {
            groups: [GroupCut {
                nibbles: false,
                first: 0,
                end: 0,
                table: zero,
                shifts: [zero; 2],
                mask: zero,
            }; 2],
            runs: [Run {
                at: 0,
                ctrl: [zero; 2],
            }; MAX_RUNS],
            query_at: [0; MAX_RUNS],
        };
        let mut n_runs = 0;
        for (g, cut) in plan.groups.iter_mut().enumerate() {
            let w = widths[g];
            let mut table = [0u8; 16];
            for (t, &level) in table.iter_mut().zip(tables[g].iter()).take(1 << w) {
                *t = (level as i32 + BIAS) as u8;
            }
            // SAFETY: 16-byte local array.
            cut.table = _mm256_broadcastsi128_si256(unsafe {
                _mm_loadu_si128(table.as_ptr() as *const __m128i)
            });
            cut.nibbles = w == 4;
            let (ctrl, shifts) = &SHIFTED[if cut.nibbles { 0 } else { w }];
            let load = |v: &[u8; 32]| {
                // SAFETY: 32-byte array.
                unsafe { _mm256_loadu_si256(v.as_ptr() as *const __m256i) }
            };
            if cut.nibbles {
                cut.shifts = [_mm256_setr_epi64x(0, 0, 4, 4); 2];
                cut.mask = _mm256_set1_epi8(0x0f);
            } else {
                for (s, v) in cut.shifts.iter_mut().zip(shifts) {
                    // SAFETY: four u64s are 32 bytes.
                    *s = unsafe { _mm256_loadu_si256(v.as_ptr() as *const __m256i) };
                }
                cut.mask = _mm256_set1_epi16((1 << w) - 1);
            }
            cut.first = n_runs;
            let group_byte = if g == 0 {
                0
            } else {
                layout.n_hi * widths[0] / 8
            };
            for k in 0..lens[g] / RUN {
                let start = group_byte + k * RUN * w / 8;
                // A run shorter than 16 bytes at the row's end is loaded from further back;
                // its shuffle indices move up by as much (`0x80` entries stay zeroing).
                let at = start.min(bytes - 16);
                let delta = _mm256_set1_epi8((start - at) as i8);
                plan.runs[n_runs] = Run {
                    at,
                    ctrl: [
                        _mm256_add_epi8(load(&ctrl[0]), delta),
                        _mm256_add_epi8(load(&ctrl[1]), delta),
                    ],
                };
                plan.query_at[n_runs] = if g == 0 { 0 } else { pad_hi } + k * RUN;
                n_runs += 1;
            }
            cut.end = n_runs;
        }
        Some(plan)
    }
}

/// The biased levels of a nibble run of the row at `row`, as 32 bytes (byte order:
/// [`code_of_byte`]).
///
/// # Safety
/// The run's 16 bytes from `row + run.at` are readable.
#[inline(always)]
unsafe fn nibbles(cut: &GroupCut, run: &Run, row: *const u8) -> __m256i {
    // SAFETY: as the caller vouches.
    let x =
        unsafe { _mm256_broadcastsi128_si256(_mm_loadu_si128(row.add(run.at) as *const __m128i)) };
    let index = _mm256_and_si256(_mm256_srlv_epi64(x, cut.shifts[0]), cut.mask);
    _mm256_shuffle_epi8(cut.table, index)
}

/// The biased levels of a shifted run of the row at `row`, as 32 bytes (byte order:
/// [`code_of_byte`]).
///
/// # Safety
/// The run's 16 bytes from `row + run.at` are readable.
#[inline(always)]
unsafe fn shifted(cut: &GroupCut, run: &Run, row: *const u8) -> __m256i {
    // SAFETY: as the caller vouches.
    let x =
        unsafe { _mm256_broadcastsi128_si256(_mm_loadu_si128(row.add(run.at) as *const __m128i)) };
    let a = _mm256_srlv_epi64(_mm256_shuffle_epi8(x, run.ctrl[0]), cut.shifts[0]);
    let b = _mm256_srlv_epi64(_mm256_shuffle_epi8(x, run.ctrl[1]), cut.shifts[1]);
    let index = _mm256_packus_epi16(_mm256_and_si256(a, cut.mask), _mm256_and_si256(b, cut.mask));
    _mm256_shuffle_epi8(cut.table, index)
}

/// Which code of its run byte `p` of [`nibbles`]' or [`shifted`]'s result holds: the pack in
/// [`shifted`] put its first register's lanes in bytes 0..8 of each half and the second's in
/// 8..16 ([`code_of_lane`] numbers them as those two registers).
const fn code_of_byte(nibbles: bool, p: usize) -> usize {
    let (half, i) = (p / 16, p % 16);
    code_of_lane(nibbles, 16 * (i / 8) + 8 * half + i % 8)
}

/// [`code_of_byte`] of every byte of a run, for shifted (index 0) and nibble (1) cuts.
static CODE_OF_BYTE: [[u8; RUN]; 2] = {
    let mut t = [[0u8; RUN]; 2];
    let mut p = 0;
    while p < RUN {
        t[0][p] = code_of_byte(false, p) as u8;
        t[1][p] = code_of_byte(true, p) as u8;
        p += 1;
    }
    t
};

/// # Safety
/// CPU must support AVX2+FMA+F16C; `plan` made for `r.layout` and `r.levels`; shapes as
/// checked by `super::super::score_codes_int`.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn score(
    plan: &WidePlan,
    r: IntRows<'_>,
    queries: IntQueries<'_>,
    scores: &mut [f32],
    stride: usize,
) {
    if r.scales.is_empty() {
        return;
    }
    let mut h0 = 0;
    while h0 < queries.n_qh {
        let left = queries.n_qh - h0;
        let kinds = (plan.groups[0].nibbles, plan.groups[1].nibbles);
        let [hi, lo] = &plan.groups;
        let one = hi.end - hi.first <= 1 && lo.end - lo.first == 1;
        macro_rules! pass {
            ($h:expr, $hi:literal, $lo:literal) => {
                if one {
                    pass::<$h, $hi, $lo, true>(plan, r, queries, h0, scores, stride)
                } else {
                    pass::<$h, $hi, $lo, false>(plan, r, queries, h0, scores, stride)
                }
            };
        }
        // Passes of 8 heads while 8 are left (prefill's many heads), then of 4, then the rest.
        let h = match left {
            HEADS.. => HEADS,
            4.. => 4,
            _ => left,
        };
        // SAFETY: same target features; heads h0..h0 + h exist; `one` as `pass` requires.
        unsafe {
            match (h, kinds) {
                (1, (false, false)) => pass!(1, false, false),
                (1, (false, true)) => pass!(1, false, true),
                (1, (true, false)) => pass!(1, true, false),
                (1, (true, true)) => pass!(1, true, true),
                (2, (false, false)) => pass!(2, false, false),
                (2, (false, true)) => pass!(2, false, true),
                (2, (true, false)) => pass!(2, true, false),
                (2, (true, true)) => pass!(2, true, true),
                (3, (false, false)) => pass!(3, false, false),
                (3, (false, true)) => pass!(3, false, true),
                (3, (true, false)) => pass!(3, true, false),
                (3, (true, true)) => pass!(3, true, true),
                (4, (false, false)) => pass!(4, false, false),
                (4, (false, true)) => pass!(4, false, true),
                (4, (true, false)) => pass!(4, true, false),
                (4, (true, true)) => pass!(4, true, true),
                (_, (false, false)) => pass!(HEADS, false, false),
                (_, (false, true)) => pass!(HEADS, false, true),
                (_, (true, false)) => pass!(HEADS, true, false),
                (_, (true, true)) => pass!(HEADS, true, true),
            }
        }
        h0 += h;
    }
}

/// Writes a run's 32 query coordinates to `out` as bytes in its level bytes' order
/// ([`code_of_byte`]); each fits a signed byte (`QUERY_MAX`).
fn permute_run(nibbles: bool, src: &[i16; RUN], out: &mut [MaybeUninit<i8>]) {
    for (o, &code) in out[..RUN].iter_mut().zip(&CODE_OF_BYTE[usize::from(nibbles)]) {
        o.write(src[code as usize] as i8);
    }
}

/// Adds a run's products with every head's query (`q`: the run's `H` heads, `RUN` bytes apart)
/// to `acc`, or starts `acc` with them when `first`: one `vpmaddubsw` (unsigned level bytes
/// times signed query bytes, pairs summed in int16 without saturating) and one `vpmaddwd` by
/// ones a head.
///
/// # Safety
/// `q` has `H · RUN` bytes.
#[inline(always)]
unsafe fn products<const H: usize>(acc: &mut [__m256i; H], levels: __m256i, q: *const i8, first: bool) {
    let ones = _mm256_set1_epi16(1);
    for (h, acc) in acc.iter_mut().enumerate() {
        // SAFETY: as the caller vouches.
        unsafe {
            let qh = _mm256_loadu_si256(q.add(h * RUN) as *const __m256i);
            let sums = _mm256_madd_epi16(_mm256_maddubs_epi16(levels, qh), ones);
            *acc = if first {
                sums
            } else {
                _mm256_add_epi32(*acc, sums)
            };
        }
    }
}

/// One group's runs of the row at `row`, added to `acc` (its first run starts `acc` when
/// `FIRST`); `q` is the group's first run's queries (runs `H · RUN` apart). `ONE`: the group
/// is one run (head dim 64's groups), which the compiler then keeps out of a loop: a K3.5 row
/// scanned 6.5 ns against 6.8 with a loop of one run (3 heads, 8 pages a call, one thread, AMD
/// EPYC Zen 3).
///
/// # Safety
/// `row` is a whole row of the plan's layout; `q` has the group's runs; `ONE`: there is one.
#[inline(always)]
unsafe fn group<const H: usize, const NIBBLES: bool, const FIRST: bool, const ONE: bool>(
    acc: &mut [__m256i; H],
    cut: &GroupCut,
    runs: &[Run],
    row: *const u8,
    q: *const i8,
) {
    if ONE {
        // SAFETY: as the caller vouches.
        unsafe {
            let run = runs.get_unchecked(0);
            let levels = if NIBBLES {
                nibbles(cut, run, row)
            } else {
                shifted(cut, run, row)
            };
            products(acc, levels, q, FIRST);
        }
        return;
    }
    for (k, run) in runs.iter().enumerate() {
        // SAFETY: as the caller vouches.
        unsafe {
            let levels = if NIBBLES {
                nibbles(cut, run, row)
            } else {
                shifted(cut, run, row)
            };
            products(acc, levels, q.add(k * H * RUN), FIRST && k == 0);
        }
    }
}

/// Scores every row for query heads `h0..h0 + H`; `r.scales` is not empty.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn pass<const H: usize, const HI_NIBBLES: bool, const LO_NIBBLES: bool, const ONE: bool>(
    plan: &WidePlan,
    r: IntRows<'_>,
    queries: IntQueries<'_>,
    h0: usize,
    scores: &mut [f32],
    stride: usize,
) {
    let layout = r.layout;
    let len = query_len(layout);
    let n_runs = plan.groups[1].end;
    // Each head's query as bytes in the level bytes' order (run k, head h at (k · H + h) ·
    // RUN), and the bias its sums carry. Only the H heads' runs are written, and only they are
    // read.
    let mut permuted = [MaybeUninit::<i8>::uninit(); HEADS * MAX_INT_DIM];
    let mut bias = [0i32; HEADS];
    for (h, bias) in bias.iter_mut().enumerate().take(H) {
        let q = queries.head(h0 + h, len);
        // The padding is zeros, so this is the sum over the lanes.
        *bias = BIAS * q.iter().map(|&v| v as i32).sum::<i32>();
        for (k, &at) in plan.query_at[..n_runs].iter().enumerate() {
            let nibbles = plan.groups[usize::from(k >= plan.groups[0].end)].nibbles;
            let src: &[i16; RUN] = q[at..at + RUN].try_into().expect("run inside the query");
            // Run k of head h lies inside `permuted` (H ≤ HEADS, n_runs ≤ MAX_RUNS).
            permute_run(nibbles, src, &mut permuted[(k * H + h) * RUN..]);
        }
    }
    let q_all = permuted.as_ptr() as *const i8;
    let [hi, lo] = &plan.groups;
    let (hi_runs, lo_runs) = (&plan.runs[hi.first..hi.end], &plan.runs[lo.first..lo.end]);
    let bytes = layout.bytes();
    let rows = r.scales.len();
    let mut sums = [[_mm256_setzero_si256(); BLOCK]; H];
    // The next row, and how many rows its page has left from it.
    let (mut page, mut row, mut left) = (0usize, r.pages[0].as_ptr(), r.page_rows);
    for j0 in (0..rows).step_by(BLOCK) {
        let nb = (rows - j0).min(BLOCK);
        for sums_t in 0..nb {
            if left == 0 {
                page += 1;
                (row, left) = (r.pages[page].as_ptr(), r.page_rows);
            }
            // Zeros only for a layout without a first group (the first run starts the sums).
            let mut acc = [_mm256_setzero_si256(); H];
            // SAFETY: `row` is a whole row inside its page (shapes checked by the caller); the
            // runs' loads lie inside the row; the query holds H heads of n_runs runs.
            unsafe {
                let lo_q = q_all.add(lo.first * H * RUN);
                if hi.first < hi.end {
                    group::<H, HI_NIBBLES, true, ONE>(&mut acc, hi, hi_runs, row, q_all);
                    group::<H, LO_NIBBLES, false, ONE>(&mut acc, lo, lo_runs, row, lo_q);
                } else {
                    group::<H, LO_NIBBLES, true, ONE>(&mut acc, lo, lo_runs, row, lo_q);
                }
            }
            row = row.wrapping_add(bytes);
            left -= 1;
            for (s, a) in sums.iter_mut().zip(acc) {
                s[sums_t] = a;
            }
        }
        crate::prefetch::pump_rows(nb);
        // Masked, not copied through a buffer (a copy of run-time length is a `memcpy` call).
        // SAFETY: the mask's lanes are the block's nb scales from j0.
        let scale = unsafe { _mm256_maskload_ps(r.scales[j0..j0 + nb].as_ptr(), tail_mask(nb)) };
        for (h, s) in sums.iter().enumerate() {
            // Wrapping int32 sums: exact once the bias is off, whatever the order.
            let sum = _mm256_sub_epi32(reduce8(s), _mm256_set1_epi32(bias[h]));
            let factor = _mm256_set1_ps(queries.factor(h0 + h));
            // The reference's `(factor · sum) · scale`, unfused.
            let out = _mm256_mul_ps(_mm256_mul_ps(factor, _mm256_cvtepi32_ps(sum)), scale);
            let at = (h0 + h) * stride + j0;
            if nb == BLOCK {
                // SAFETY: the 8 scores from `at` lie inside `scores` (stride ≥ rows).
                unsafe { _mm256_storeu_ps(scores[at..at + BLOCK].as_mut_ptr(), out) };
            } else {
                let mut eight = [0.0f32; BLOCK];
                // SAFETY: 8-float local array.
                unsafe { _mm256_storeu_ps(eight.as_mut_ptr(), out) };
                scores[at..at + nb].copy_from_slice(&eight[..nb]);
            }
        }
    }
}
