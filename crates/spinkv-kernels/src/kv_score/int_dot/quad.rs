//! NEON / SIMD128 integer scan: rows unpacked by the 4-lane code unpacker, then the shared
//! row loop, whose table lookups and int16 · int16 → int32 sums the compiler vectorises for
//! the build's ISA (integer sums: the same bits as the reference in any order).

use super::{score_unpacked_rows, IntQueries, IntRows};
#[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
#[path = "swizzle128.rs"]
mod swizzle128;
use crate::codes::quad::RowDecoder;
use crate::codes::Levels;

/// # Safety
/// NEON or SIMD128 (whichever this build has); shapes as checked by
/// `super::score_codes_int`.
pub unsafe fn score_codes_int(
    r: IntRows<'_>,
    queries: IntQueries<'_>,
    scores: &mut [f32],
    stride: usize,
) {
    #[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
    // SAFETY: this build has SIMD128; shapes checked by the caller.
    if unsafe { swizzle128::try_score(r, queries, scores, stride) } {
        return;
    }
    // The unpacker needs level tables only to decode, never to unpack.
    let none = [0.0f32; 16];
    let levels = Levels {
        hi: &none,
        lo: &none,
    };
    // SAFETY: same target features as this function; the decoder reads only the row's bytes.
    let decoder = unsafe { RowDecoder::new(r.layout, levels) };
    // SAFETY: same target features as this function; `row` is one whole packed row.
    let unpack = |row: &[u8], codes: &mut [u8]| unsafe { decoder.unpack(row, 0, codes) };
    score_unpacked_rows(r, queries, scores, stride, unpack);
}
