//! Bulk f16 <-> f32 conversion (KV-cache writes/reads, embedding rows).

pub mod scalar;

#[cfg(target_arch = "x86_64")]
pub mod avx2;

use half::f16;

/// Round-to-nearest-even narrowing, as `half::f16::from_f32`.
pub fn f32_to_f16(src: &[f32], dst: &mut [f16]) {
    assert_eq!(src.len(), dst.len(), "f32_to_f16: length mismatch");
    #[cfg(target_arch = "x86_64")]
    if crate::isa::use_avx2() {
        // SAFETY: AVX2/FMA/F16C were verified before use_avx2() could be true.
        unsafe { avx2::f32_to_f16(src, dst) };
        return;
    }
    scalar::f32_to_f16(src, dst)
}

pub fn f16_to_f32(src: &[f16], dst: &mut [f32]) {
    assert_eq!(src.len(), dst.len(), "f16_to_f32: length mismatch");
    #[cfg(target_arch = "x86_64")]
    if crate::isa::use_avx2() {
        // SAFETY: AVX2/FMA/F16C were verified before use_avx2() could be true.
        unsafe { avx2::f16_to_f32(src, dst) };
        return;
    }
    scalar::f16_to_f32(src, dst)
}

#[cfg(test)]
mod tests {
    #[cfg_attr(not(target_arch = "x86_64"), allow(unused_imports))]
    use super::*;
    #[cfg_attr(not(target_arch = "x86_64"), allow(unused_imports))]
    use crate::test_util::*;

    #[test]
    #[cfg(target_arch = "x86_64")]
    fn avx2_matches_scalar_bit_for_bit() {
        if !avx2_available() {
            eprintln!("skipped: no avx2");
            return;
        }
        for &n in &AWKWARD_SIZES {
            let mut src = random_vec(n as u64, n);
            src.iter_mut().for_each(|v| *v *= 70000.0); // includes f16 overflow to inf
            let mut expected = vec![f16::ZERO; n];
            let mut got = vec![f16::ZERO; n];
            scalar::f32_to_f16(&src, &mut expected);
            // SAFETY: CPU support checked above.
            unsafe { avx2::f32_to_f16(&src, &mut got) };
            assert_eq!(got, expected, "f32_to_f16 n={n}");
            let mut back_expected = vec![0.0; n];
            let mut back_got = vec![0.0; n];
            scalar::f16_to_f32(&expected, &mut back_expected);
            // SAFETY: CPU support checked above.
            unsafe { avx2::f16_to_f32(&expected, &mut back_got) };
            assert_eq!(back_got, back_expected, "f16_to_f32 n={n}");
        }
    }
}
