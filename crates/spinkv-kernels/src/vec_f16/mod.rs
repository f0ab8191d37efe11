//! Mixed f16/f32 vector primitives for the fp16 KV cache: keys and values are stored as f16,
//! queries and outputs stay f32.

pub mod scalar;

#[cfg(target_arch = "x86_64")]
pub mod avx2;

use half::f16;

/// `Σ x[i]·y[i]` with `x` in f16 (a cached key) and `y` in f32 (a query).
pub fn dot_f16(x: &[f16], y: &[f32]) -> f32 {
    assert_eq!(x.len(), y.len(), "dot_f16: length mismatch");
    #[cfg(target_arch = "x86_64")]
    if crate::isa::use_avx2() {
        // SAFETY: AVX2/FMA/F16C were verified before use_avx2() could be true.
        return unsafe { avx2::dot_f16(x, y) };
    }
    scalar::dot_f16(x, y)
}

/// `y[i] += a·x[i]` with `x` in f16 (a cached value) and the accumulator `y` in f32.
pub fn axpy_f16(a: f32, x: &[f16], y: &mut [f32]) {
    assert_eq!(x.len(), y.len(), "axpy_f16: length mismatch");
    #[cfg(target_arch = "x86_64")]
    if crate::isa::use_avx2() {
        // SAFETY: AVX2/FMA/F16C were verified before use_avx2() could be true.
        unsafe { avx2::axpy_f16(a, x, y) };
        return;
    }
    scalar::axpy_f16(a, x, y)
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
            let x: Vec<f16> = random_vec(n as u64, n)
                .iter()
                .map(|&v| f16::from_f32(v))
                .collect();
            let y = random_vec(n as u64 + 9, n);
            // SAFETY: CPU support checked above.
            let got = unsafe { avx2::dot_f16(&x, &y) };
            assert_close(
                got,
                scalar::dot_f16(&x, &y),
                n as f32,
                &format!("dot_f16 n={n}"),
            );
            let mut expected = y.clone();
            let mut got = y.clone();
            scalar::axpy_f16(-1.5, &x, &mut expected);
            // SAFETY: CPU support checked above.
            unsafe { avx2::axpy_f16(-1.5, &x, &mut got) };
            for (g, e) in got.iter().zip(&expected) {
                assert_close(*g, *e, 3.0, &format!("axpy_f16 n={n}"));
            }
        }
    }
}
