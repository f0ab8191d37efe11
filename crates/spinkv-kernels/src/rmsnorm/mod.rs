//! RMSNorm: `out[i] = x[i] / sqrt(mean(x²) + eps) * weight[i]`.

pub mod scalar;

#[cfg(target_arch = "x86_64")]
pub mod avx2;

pub fn rmsnorm(x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) {
    check_shapes(x, weight, out);
    #[cfg(target_arch = "x86_64")]
    if crate::isa::use_avx2() {
        // SAFETY: AVX2/FMA/F16C were verified before use_avx2() could be true.
        unsafe { avx2::rmsnorm(x, weight, eps, out) };
        return;
    }
    scalar::rmsnorm(x, weight, eps, out)
}

pub(crate) fn check_shapes(x: &[f32], weight: &[f32], out: &[f32]) {
    assert_eq!(
        x.len(),
        weight.len(),
        "rmsnorm: x and weight differ in length"
    );
    assert_eq!(x.len(), out.len(), "rmsnorm: x and out differ in length");
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
            let x = random_vec(n as u64, n);
            let w = random_vec(n as u64 + 1, n);
            let mut expected = vec![0.0; n];
            let mut got = vec![0.0; n];
            scalar::rmsnorm(&x, &w, 1e-5, &mut expected);
            // SAFETY: CPU support checked above.
            unsafe { avx2::rmsnorm(&x, &w, 1e-5, &mut got) };
            for (g, e) in got.iter().zip(&expected) {
                // Outputs are O(|w| * |x| / rms): relative 1e-5 is the stated tolerance.
                assert_close(*g, *e, e.abs(), &format!("rmsnorm n={n}"));
            }
        }
    }

    #[test]
    fn unit_rms_is_identity() {
        let x = [1.0, -1.0, 1.0, -1.0];
        let mut out = [0.0; 4];
        scalar::rmsnorm(&x, &[1.0; 4], 0.0, &mut out);
        assert_eq!(out, x);
    }
}
