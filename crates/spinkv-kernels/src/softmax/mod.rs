//! Numerically stable softmax in place (max-subtracted), and the exp-and-sum step that
//! streaming attention uses on each page of scores.

crate::isa::isa_modules!(scalar, avx2, avx512, neon, simd128);

use crate::isa::{active_isa, dispatch, Isa};

/// Empty input is a no-op. A row of all `-inf` becomes NaN, as in any softmax: callers mask
/// with at least one finite score.
pub fn softmax_inplace(x: &mut [f32]) {
    if x.is_empty() {
        return;
    }
    let max = max_f32(x);
    let sum = exp_sub_sum(x, max);
    crate::vec_f32::scale_f32(x, 1.0 / sum);
}

/// Largest element (`-inf` for an empty slice; NaNs are ignored by the SIMD versions only).
pub fn max_f32(x: &[f32]) -> f32 {
    // SAFETY: active_isa() only returns ISAs validated against this CPU.
    unsafe { max_f32_on(active_isa(), x) }
}

/// `x[i] = e^(x[i] - m)` in place; returns the sum of the new values. Scores at `-inf`
/// (masked) become 0. Every ISA takes the canonical softmax polynomial
/// (`crate::canon::exp_softmax`).
pub fn exp_sub_sum(x: &mut [f32], m: f32) -> f32 {
    // SAFETY: as above.
    unsafe { exp_sub_sum_on(active_isa(), x, m) }
}

/// Scores per check of [`exp_sub_sum_capped`].
pub const CAP_BLOCK: usize = 64;

/// [`exp_sub_sum`] over the longest prefix of `x` made of whole [`CAP_BLOCK`]-score blocks
/// (the last one may be shorter) none of whose scores is above `cap`; returns the prefix's
/// length and sum (the canonical sum of [`exp_sub_sum`] over the prefix). The rest of `x` is
/// left as it is. Streaming attention calls it with its reference score as `m` and a headroom
/// above it as `cap`: a tile whose scores stay under the cap needs no max pass of its own.
/// `m` must be finite.
pub fn exp_sub_sum_capped(x: &mut [f32], m: f32, cap: f32) -> (usize, f32) {
    // SAFETY: as above.
    unsafe { exp_sub_sum_capped_on(active_isa(), x, m, cap) }
}

/// How many of `x`'s leading scores [`exp_sub_sum_capped`] takes, found with `max` (an ISA's
/// `max_f32`): the blocks before the first one whose max is above `cap`.
#[inline(always)]
pub(crate) fn capped_prefix(x: &[f32], cap: f32, max: impl Fn(&[f32]) -> f32) -> usize {
    x.chunks(CAP_BLOCK)
        .take_while(|block| max(block) <= cap)
        .map(<[f32]>::len)
        .sum()
}

/// Which of `blocks` blocks of `block` columns hold a weight of at least its row's limit: bit
/// `b` is set when some row `r < limits.len()` has `x[r·stride + b·block + j] ≥ limits[r]` for
/// some `j < block`. Sparse values ask this of a tile's pages (a block a page, a row a query
/// head) in one call instead of a max per page and head.
pub fn blocks_reaching(
    x: &[f32],
    stride: usize,
    block: usize,
    blocks: usize,
    limits: &[f32],
) -> u64 {
    assert!(blocks <= 64, "blocks_reaching: more than 64 blocks");
    if let Some(last) = limits.len().checked_sub(1) {
        assert!(
            x.len() >= last * stride + blocks * block && (last == 0 || blocks * block <= stride),
            "blocks_reaching: rows shorter than the blocks"
        );
    }
    // SAFETY: as above; shapes checked.
    unsafe { blocks_reaching_on(active_isa(), x, stride, block, blocks, limits) }
}

/// # Safety
/// `isa` must run on this CPU; shapes as [`blocks_reaching`] checks.
pub(crate) unsafe fn blocks_reaching_on(
    isa: Isa,
    x: &[f32],
    stride: usize,
    block: usize,
    blocks: usize,
    limits: &[f32],
) -> u64 {
    // A bit per page of a tile, from vector compares on x86; the other ISAs run the
    // reference's early-exit loop.
    #[cfg(target_arch = "x86_64")]
    match isa {
        // SAFETY (both): the caller vouches that `isa` runs on this CPU; shapes as checked.
        Isa::Avx512 => return unsafe { avx512::blocks_reaching(x, stride, block, blocks, limits) },
        Isa::Avx2 => return unsafe { avx2::blocks_reaching(x, stride, block, blocks, limits) },
        _ => {}
    }
    let _ = isa;
    scalar::blocks_reaching(x, stride, block, blocks, limits)
}

/// # Safety
/// `isa` must run on this CPU.
pub(crate) unsafe fn exp_sub_sum_capped_on(
    isa: Isa,
    x: &mut [f32],
    m: f32,
    cap: f32,
) -> (usize, f32) {
    #[cfg(target_arch = "x86_64")]
    if isa == Isa::Avx512 {
        // SAFETY: the caller vouches that `isa` runs on this CPU.
        return unsafe { avx512::exp_sub_sum_capped(x, m, cap) };
    }
    // The others: the ISA's own max per block, then its own pass over the blocks under the cap
    // (what the reference does).
    // SAFETY (both): as above.
    let done = capped_prefix(x, cap, |block| unsafe { max_f32_on(isa, block) });
    (done, unsafe { exp_sub_sum_on(isa, &mut x[..done], m) })
}

/// # Safety
/// `isa` must run on this CPU.
pub(crate) unsafe fn max_f32_on(isa: Isa, x: &[f32]) -> f32 {
    dispatch!(isa, max_f32(x))
}

/// # Safety
/// `isa` must run on this CPU.
pub(crate) unsafe fn exp_sub_sum_on(isa: Isa, x: &mut [f32], m: f32) -> f32 {
    dispatch!(isa, exp_sub_sum(x, m))
}

#[cfg(any(test, feature = "parity"))]
pub(crate) fn parity(isa: Isa) -> crate::test_util::Check {
    use crate::test_util::*;
    for &n in &AWKWARD_SIZES {
        // Spread of ±30 exercises the exp polynomial's range reduction; one masked score.
        let mut x: Vec<f32> = random_vec(n as u64, n).iter().map(|v| v * 30.0).collect();
        if n > 2 {
            x[n / 2] = f32::NEG_INFINITY;
        }
        // SAFETY (all `_on` calls): `isa` comes from the runnable list.
        let max = unsafe { max_f32_on(isa, &x) };
        identical(&[max], &[scalar::max_f32(&x)], &|| format!("max_f32 n={n}"))?;
        let mut expected = x.clone();
        let mut got = x.clone();
        let sum_expected = scalar::exp_sub_sum(&mut expected, max);
        let sum_got = unsafe { exp_sub_sum_on(isa, &mut got, max) };
        if is_canonical(isa) {
            canonical(isa, &got, &expected, 0.0, &|| format!("exp_sub_sum n={n}"))?;
        }
        for (i, (g, e)) in got.iter().zip(&expected).enumerate() {
            // Exponentials: relative 1e-5 plus absolute 1e-7.
            if (g - e).abs() > 1e-7 + 1e-5 * e {
                return Err(format!("exp_sub_sum n={n} [{i}]: {g} vs {e}"));
            }
        }
        canonical(isa, &[sum_got], &[sum_expected], sum_expected, &|| {
            format!("exp_sub_sum sum n={n}")
        })?;
        // Capped: one score above the cap in a later block, or none; the prefix and its sum
        // as the reference's, the rest untouched.
        for above in [None, Some(n / 2), Some(n.saturating_sub(1)), Some(0)] {
            let mut x = x.clone();
            let cap = 30.0;
            if let Some(at) = above.filter(|&at| at < n) {
                x[at] = cap + 1.0;
            }
            let (mut want, mut got) = (x.clone(), x.clone());
            let (done_want, sum_want) = scalar::exp_sub_sum_capped(&mut want, max, cap);
            // SAFETY: as above.
            let (done_got, sum_got) = unsafe { exp_sub_sum_capped_on(isa, &mut got, max, cap) };
            let what = || format!("exp_sub_sum_capped n={n} above={above:?}");
            if done_got != done_want {
                return Err(format!(
                    "{}: {done_got} scores done, want {done_want}",
                    what()
                ));
            }
            if x[done_got..] != got[done_got..] {
                return Err(format!("{}: scores past the prefix changed", what()));
            }
            canonical(isa, &got[..done_got], &want[..done_want], 1.0, &what)?;
            canonical(isa, &[sum_got], &[sum_want], sum_want, &what)?;
        }
    }
    // Blocks reaching: each block's one weight at the limit (or a hair below), by row; blocks
    // of whole vectors and with a tail.
    let (stride, blocks) = (100, 3);
    for (rows, block) in [(1usize, 32usize), (3, 32), (3, 13)] {
        for case in 0..(rows * blocks * 2) {
            let mut w = vec![0.25f32; rows * stride];
            let limits: Vec<f32> = (0..rows).map(|r| 1.0 + r as f32).collect();
            let (r, b, below) = (case / (blocks * 2), case / 2 % blocks, case % 2 == 1);
            let at = r * stride + b * block + (case * 7) % block;
            w[at] = if below { limits[r] * 0.999 } else { limits[r] };
            let want = scalar::blocks_reaching(&w, stride, block, blocks, &limits);
            // SAFETY: as above; 3 blocks of at most 32 fit rows of 100.
            let got = unsafe { blocks_reaching_on(isa, &w, stride, block, blocks, &limits) };
            if got != want || want != u64::from(!below) << b {
                return Err(format!(
                    "blocks_reaching rows={rows} block={block} case={case}: {got:b} vs {want:b}"
                ));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_neg_infinity_and_empty() {
        for isa in crate::runnable_isas() {
            crate::set_isa(isa).unwrap();
            let mut x = [0.0, f32::NEG_INFINITY, 0.0];
            softmax_inplace(&mut x);
            assert_eq!(x, [0.5, 0.0, 0.5], "{isa}");
            softmax_inplace(&mut []);
        }
        crate::set_isa(crate::detected_isa()).unwrap();
    }

    #[test]
    fn capped_stops_before_the_block_above_the_cap() {
        let mut x = vec![0.0f32; 3 * CAP_BLOCK + 5];
        x[2 * CAP_BLOCK + 7] = 9.0;
        let (done, sum) = scalar::exp_sub_sum_capped(&mut x, 0.0, 8.0);
        assert_eq!(done, 2 * CAP_BLOCK);
        assert_eq!(sum, (2 * CAP_BLOCK) as f32);
        assert_eq!(x[done + 7], 9.0, "past the prefix, scores stay");
        assert_eq!(x[done], 0.0);
        let (all, _) = scalar::exp_sub_sum_capped(&mut x[done..], 0.0, 9.0);
        assert_eq!(all, CAP_BLOCK + 5, "a cap at the max takes every block");
    }

    #[test]
    fn sums_to_one() {
        let mut x: Vec<f32> = crate::test_util::random_vec(3, 129)
            .iter()
            .map(|v| v * 30.0)
            .collect();
        softmax_inplace(&mut x);
        let total: f32 = x.iter().sum();
        assert!((total - 1.0).abs() < 1e-4, "sums to {total}");
    }
}
