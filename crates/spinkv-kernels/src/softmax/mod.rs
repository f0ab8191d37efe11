//! Numerically stable softmax in place (max-subtracted).

pub mod scalar;

#[cfg(target_arch = "x86_64")]
pub mod avx2;

/// Empty input is a no-op. A row of all `-inf` becomes NaN, as in any softmax: callers mask
/// with at least one finite score.
pub fn softmax_inplace(x: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if crate::isa::use_avx2() {
        // SAFETY: AVX2/FMA/F16C were verified before use_avx2() could be true.
        unsafe { avx2::softmax_inplace(x) };
        return;
    }
    scalar::softmax_inplace(x)
}

#[cfg(test)]
mod tests {
    #[cfg_attr(not(target_arch = "x86_64"), allow(unused_imports))]
    use super::*;
    #[cfg_attr(not(target_arch = "x86_64"), allow(unused_imports))]
    use crate::test_util::*;

    #[test]
    #[cfg(target_arch = "x86_64")]
    fn avx2_matches_scalar() {
        if !avx2_available() {
            eprintln!("skipped: no avx2");
            return;
        }
        for &n in &AWKWARD_SIZES {
            // Spread of ±30 exercises the exp polynomial's range reduction.
            let x: Vec<f32> = random_vec(n as u64, n).iter().map(|v| v * 30.0).collect();
            let mut expected = x.clone();
            let mut got = x.clone();
            scalar::softmax_inplace(&mut expected);
            // SAFETY: CPU support checked above.
            unsafe { avx2::softmax_inplace(&mut got) };
            for (g, e) in got.iter().zip(&expected) {
                // Probabilities: absolute 1e-6 plus relative 1e-5.
                assert!(
                    (g - e).abs() <= 1e-6 + 1e-5 * e,
                    "softmax n={n}: {g} vs {e}"
                );
            }
            let total: f32 = got.iter().sum();
            assert!((total - 1.0).abs() < 1e-4, "softmax n={n} sums to {total}");
        }
    }

    #[test]
    fn handles_neg_infinity_and_empty() {
        let mut x = [0.0, f32::NEG_INFINITY, 0.0];
        softmax_inplace(&mut x);
        assert_eq!(x, [0.5, 0.0, 0.5]);
        softmax_inplace(&mut []);
    }
}
