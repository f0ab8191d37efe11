//! AVX-512 integer scan: two rows per register, codes cut by VBMI, sums by VNNI.
//!
//! Rows come in pairs: row A's bytes in one register, row B's in another (masked loads, so a
//! row is never read past its end). Each register of levels holds 16 codes of each row (one
//! 256-bit half per row): one `vpermt2b` gathers, for every group of 4 codes, the 8 bytes the
//! codes sit in into that group's 64-bit lane; one `vpmultishiftqb` moves each code to the low
//! byte of its 16-bit lane (any width, any bit offset: the plan says where); one zero-masked
//! `vpermb` looks the low bytes up in a 64-entry table of the group's biased levels (`level +
//! 128`, repeated every `2^w` entries, so the bits above the code need no mask) and zeroes the
//! high bytes — int16 levels, zero-extended. `vpdpwssd` multiplies them with each head's query
//! (the same 16 coordinates in both halves) and adds into int32 in one instruction; the bias
//! comes off as `128 · Σ q` per head after the reduction. Wrapping int32 sums are exact, so the
//! result is the scalar reference's bits.
//!
//! A block of 16 rows is 8 pairs, rows `(i, i + 4)` of each half, so the transposing reduction
//! (unpack / unpack / 128-bit shuffle, 21 instructions per 16 rows and head) leaves the 16
//! row sums in order.
//!
//! The plan (gather indices, shift controls, group masks) depends on the layout only and is
//! built once per thread and layout; a call builds the two tables and the heads' duplicated
//! queries. Needs AVX-512 VBMI and VNNI on top of F/BW/VL (checked at run time) and rows of at
//! most 64 bytes (head dim 128 at 4 bits); otherwise the AVX2 kernel runs.

use super::{IntQueries, IntRows};

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
    if paired::cpu_has_vbmi_vnni() && paired::fits(r.layout) {
        // SAFETY: VBMI and VNNI detected just now; shapes checked by the caller.
        unsafe { paired::score(r, queries, scores, stride) }
    } else {
        // SAFETY: AVX-512 F implies the AVX2+FMA+F16C the callee needs; shapes checked.
        unsafe { super::avx2::score_codes_int(r, queries, scores, stride) }
    }
}
