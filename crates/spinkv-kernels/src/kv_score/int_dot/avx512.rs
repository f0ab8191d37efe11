//! AVX-512 machines run the AVX2 integer scan (its 256-bit byte shuffles are what the
//! 16-entry level tables need; a 512-bit version is future work).

use super::{IntQueries, IntRows};

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
    // SAFETY: AVX-512 F implies the AVX2+FMA+F16C the callee needs; shapes checked.
    unsafe { super::avx2::score_codes_int(r, queries, scores, stride) }
}
