//! Rounding to integers in plain float adds: `round_ties_even` is a library call on x86-64
//! without SSE4.1 and a saturating `as i32` does not vectorize, so the kernels' hot loops round
//! by adding 1.5 · 2^23 (f32 arithmetic rounds to nearest even, leaving no fraction bits).

const SHIFT: f32 = 12_582_912.0;
/// The bits of `SHIFT`: the sum's bits minus these are the integer.
const SHIFT_BITS: i32 = 0x4B40_0000;

/// `x` rounded to the nearest integer, ties to even, for `|x| ≤ 2^22`.
#[inline(always)]
pub(crate) fn round_even(x: f32) -> f32 {
    (x + SHIFT) - SHIFT
}

/// [`round_even`] as an integer, for `|x| < 2^22 - 1` (the sum stays below 2^24, in one binade
/// with `SHIFT`).
#[inline(always)]
pub(crate) fn round_even_int(x: f32) -> i32 {
    ((x + SHIFT).to_bits() as i32).wrapping_sub(SHIFT_BITS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounding_matches_round_ties_even() {
        for i in -2000..2000 {
            for x in [i as f32 * 0.25, i as f32 * 0.1 + 0.05, i as f32 * 0.5] {
                // Equal as numbers: -0.3 gives +0, not -0 (no sum on the grid can end at -0).
                assert_eq!(round_even(x), x.round_ties_even(), "{x}");
                assert_eq!(round_even_int(x), x.round_ties_even() as i32, "{x}");
            }
        }
        assert_eq!(round_even_int(1_000_000.5), 1_000_000);
        assert_eq!(round_even_int(-1_000_001.5), -1_000_002);
    }
}
