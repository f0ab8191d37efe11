//! f32 vector primitives used by attention: `dot_f32` and `axpy_f32` (`y += a·x`).

pub mod scalar;

#[cfg(target_arch = "x86_64")]
pub mod avx2;

pub fn dot_f32(x: &[f32], y: &[f32]) -> f32 {
    assert_eq!(x.len(), y.len(), "dot_f32: length mismatch");
    #[cfg(target_arch = "x86_64")]
    if crate::isa::use_avx2() {
        // SAFETY: AVX2/FMA/F16C were verified before use_avx2() could be true.
        return unsafe { avx2::dot_f32(x, y) };
    }
    scalar::dot_f32(x, y)
}

/// `y[i] += a * x[i]`.
pub fn axpy_f32(a: f32, x: &[f32], y: &mut [f32]) {
    assert_eq!(x.len(), y.len(), "axpy_f32: length mismatch");
    #[cfg(target_arch = "x86_64")]
    if crate::isa::use_avx2() {
        // SAFETY: AVX2/FMA/F16C were verified before use_avx2() could be true.
        unsafe { avx2::axpy_f32(a, x, y) };
        return;
    }
    scalar::axpy_f32(a, x, y)
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
            let y = random_vec(n as u64 + 5, n);
            // SAFETY: CPU support checked above.
            let got = unsafe { avx2::dot_f32(&x, &y) };
            assert_close(
                got,
                scalar::dot_f32(&x, &y),
                n as f32,
                &format!("dot_f32 n={n}"),
            );
            let mut expected = y.clone();
            let mut got = y.clone();
            scalar::axpy_f32(0.37, &x, &mut expected);
            // SAFETY: CPU support checked above.
            unsafe { avx2::axpy_f32(0.37, &x, &mut got) };
            for (g, e) in got.iter().zip(&expected) {
                assert_close(*g, *e, 2.0, &format!("axpy_f32 n={n}"));
            }
        }
    }
}
