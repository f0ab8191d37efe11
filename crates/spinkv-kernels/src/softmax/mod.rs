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
/// (masked) become 0. SIMD versions use a polynomial exp (~2 ulp), the scalar one libm.
pub fn exp_sub_sum(x: &mut [f32], m: f32) -> f32 {
    // SAFETY: as above.
    unsafe { exp_sub_sum_on(active_isa(), x, m) }
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
