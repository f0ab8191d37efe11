//! Bulk f16 <-> f32 conversion (KV-cache writes/reads, embedding rows). Every ISA rounds
//! exactly like `half` (to nearest even): the outputs are bit-identical.

crate::isa::isa_modules!(scalar, avx2, avx512, neon, simd128);

use crate::isa::{active_isa, dispatch, Isa};
use half::f16;

/// Round-to-nearest-even narrowing, as `half::f16::from_f32`.
pub fn f32_to_f16(src: &[f32], dst: &mut [f16]) {
    assert_eq!(src.len(), dst.len(), "f32_to_f16: length mismatch");
    // SAFETY: active_isa() only returns ISAs validated against this CPU.
    unsafe { f32_to_f16_on(active_isa(), src, dst) }
}

pub fn f16_to_f32(src: &[f16], dst: &mut [f32]) {
    assert_eq!(src.len(), dst.len(), "f16_to_f32: length mismatch");
    // SAFETY: as above.
    unsafe { f16_to_f32_on(active_isa(), src, dst) }
}

/// The bytes of fp16 values (for byte-wise helpers such as `prefetch::to_l1`; only the x86
/// kernels take them).
#[cfg(target_arch = "x86_64")]
pub(crate) fn half_bytes(values: &[f16]) -> &[u8] {
    // SAFETY: f16 is two plain bytes with no padding; the view covers the same memory for
    // the same lifetime and is read-only.
    unsafe { core::slice::from_raw_parts(values.as_ptr() as *const u8, values.len() * 2) }
}

/// # Safety
/// `isa` must run on this CPU; `src.len() == dst.len()`.
pub(crate) unsafe fn f32_to_f16_on(isa: Isa, src: &[f32], dst: &mut [f16]) {
    dispatch!(isa, f32_to_f16(src, dst))
}

/// # Safety
/// As [`f32_to_f16_on`].
pub(crate) unsafe fn f16_to_f32_on(isa: Isa, src: &[f16], dst: &mut [f32]) {
    dispatch!(isa, f16_to_f32(src, dst))
}

#[cfg(any(test, feature = "parity"))]
pub(crate) fn parity(isa: Isa) -> crate::test_util::Check {
    use crate::test_util::*;
    // Specials and rounding edges: signed zeros, the f16 subnormal range and its halfway
    // points, overflow to inf, inf, NaN with a payload.
    let specials = [
        0.0,
        -0.0,
        5.960_464_5e-8,
        2.980_232_2e-8,
        8.940_697e-8,
        6.097_555e-5,
        6.103_515_6e-5,
        65504.0,
        65519.99,
        65520.0,
        -1e9,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::from_bits(0x7fc1_2345),
        f32::from_bits(0xff80_0001),
        1.000_488_3,
        1.000_976_6,
        1.001_464_8,
    ];
    for &n in AWKWARD_SIZES.iter().chain(&[specials.len()]) {
        let mut src = random_vec(n as u64, n);
        for (i, v) in src.iter_mut().enumerate() {
            // Magnitudes from 2^-30 to 2^17: subnormal halves, normals, overflow to inf.
            *v *= (2.0f32).powi((i as i32 * 7) % 48 - 30);
        }
        if n == specials.len() {
            src.copy_from_slice(&specials);
        }
        let mut expected = vec![f16::ZERO; n];
        let mut got = vec![f16::ZERO; n];
        scalar::f32_to_f16(&src, &mut expected);
        // SAFETY (both `_on` calls): `isa` comes from the runnable list.
        unsafe { f32_to_f16_on(isa, &src, &mut got) };
        let bits = |v: &[f16]| v.iter().map(|h| h.to_bits()).collect::<Vec<_>>();
        identical(&bits(&got), &bits(&expected), &|| {
            format!("f32_to_f16 n={n}")
        })?;
        let mut back_expected = vec![0.0f32; n];
        let mut back_got = vec![0.0f32; n];
        scalar::f16_to_f32(&expected, &mut back_expected);
        unsafe { f16_to_f32_on(isa, &expected, &mut back_got) };
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        identical(&bits(&back_got), &bits(&back_expected), &|| {
            format!("f16_to_f32 n={n}")
        })?;
    }
    Ok(())
}
