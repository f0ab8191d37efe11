//! AVX-512 integer scan: two or four rows per register, codes cut by VBMI, sums by VNNI.
//!
//! Rows come in pairs: row A's bytes in one register, row B's in another (masked loads, so a
//! row is never read past its end). A span of 32 codes per row is cut for both rows by three
//! byte shuffles: one `vpermt2b` gathers, for every 8 consecutive codes, the 8 bytes they sit in into one
//! 64-bit lane (row A's lanes in the low 256 bits, B's in the high); one `vpmultishiftqb` moves
//! each code to a byte of its own (any width, any bit offset: the plan says where); one
//! zero-masked `vpermb` looks all 64 up in a 64-entry table of the group's biased levels
//! (`level + 128`, repeated every `2^w` entries, so the bits above a code need no mask). Each
//! 32-bit lane then holds 4 consecutive levels of one row as unsigned bytes, and `vpdpbusd`
//! multiplies them by the head's int8 query coordinates (the span's, repeated in every row's
//! part of the register once per call) and adds the four products into int32 in one
//! instruction: 64 products, against 32 for `vpdpwssd` on int16 lanes, and no split into even
//! and odd bytes. The bias comes off as `128 · Σ q` per head after the reduction. Wrapping
//! int32 sums are exact, so the result is the scalar reference's bits.
//!
//! A block of 16 rows is 8 pairs (pair `i` of each half of the block: its rows `i` and `i + 4`),
//! so the transposing reduction (unpack / unpack / 128-bit shuffle, 21 instructions per 16 rows
//! and head) leaves the 16 row sums in order. Rows of up to 32 bytes (head dim 64 at 4 bits)
//! go four to a register instead (two rows per source register, one per 256-bit half; 16
//! codes of each per span, one row per 128-bit quarter): quad `i` holds rows `i + 4k`, and the
//! reduction is 9 instructions per 16 rows and head (measured ~10 % faster at d 64, 3 heads).
//!
//! The plan (gather indices, shift controls, group masks) depends on the layout only and is
//! built once per thread and layout; a call builds the two tables and the heads' duplicated
//! queries. A row of up to 64 bytes (head dim 128 at 4 bits) is loaded once per pair (a 256-bit load
//! up to 32 bytes); a longer one (up to 128 bytes: head dim 256) once per span, 32 bytes from
//! the span's first code (a 256-bit load: 64-byte ones measured ~12 % slower there). Needs
//! AVX-512 VBMI and VNNI on top of F/BW/VL (checked at run time); without them the AVX2 kernel
//! runs.
//!
//! Rows of 64 padded codes whose halves are each one channel group (head dim 64 at 3.5, 4 or 3
//! bits), in pages of a multiple of 16 rows, go four consecutive rows to a register pair
//! instead (`contiguous`): two loads per quad, one gather per 32 codes and two cuts of it, and
//! everything the rows meet held in registers. `kernel_bench`'s key scan (8 pages a call, 3
//! heads, scales decoded per page) went from 3.36 to 2.66 ns per row on an AMD EPYC Zen 4.
//!
//! From [`heads::MIN_HEADS`] query heads on (a prefill item scores 64 queries × the group
//! against every row), the run is laid out once as biased levels and each `vpdpbusd` yields 16
//! rows' partial sums of one head, with no reduction (`heads`). Same integer sums, same bits.

use super::{IntQueries, IntRows};

mod contiguous;
mod heads;
mod paired;

/// # Safety
/// CPU must support AVX-512 F/BW/VL (+AVX2/FMA/F16C); shapes as checked by
/// `super::score_codes_int`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
pub unsafe fn score_codes_int(
    r: IntRows<'_>,
    queries: IntQueries<'_>,
    scores: &mut [f32],
    stride: usize,
) {
    if queries.n_qh >= heads::MIN_HEADS && is_x86_feature_detected!("avx512vnni") {
        // SAFETY: VNNI detected just now; shapes checked by the caller.
        unsafe { heads::score(r, queries, scores, stride) }
    } else if paired::cpu_has_vbmi_vnni() {
        // SAFETY: VBMI and VNNI detected just now; shapes checked by the caller.
        unsafe {
            if !contiguous::try_score(r, queries, scores, stride) {
                paired::score(r, queries, scores, stride)
            }
        }
    } else {
        // SAFETY: AVX-512 F implies the AVX2+FMA+F16C the callee needs; shapes checked.
        unsafe { super::avx2::score_codes_int(r, queries, scores, stride) }
    }
}
