//! Mixed f16/f32 vector primitives for the fp16 KV cache: keys and values are stored as f16,
//! queries and outputs stay f32.

// The per-ISA kernels are vec_f32's, generic over the row dtype.
#[cfg(target_arch = "aarch64")]
use crate::vec_f32::quad as neon;
#[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
use crate::vec_f32::quad as simd128;
use crate::vec_f32::scalar;
#[cfg(target_arch = "x86_64")]
use crate::vec_f32::{avx2, avx512};

use crate::isa::{active_isa, dispatch, Isa};
use half::f16;

/// `Σ x[i]·y[i]` with `x` in f16 (a cached key) and `y` in f32 (a query).
pub fn dot_f16(x: &[f16], y: &[f32]) -> f32 {
    assert_eq!(x.len(), y.len(), "dot_f16: length mismatch");
    // SAFETY: active_isa() only returns ISAs validated against this CPU.
    unsafe { dot_f16_on(active_isa(), x, y) }
}

/// `y[i] += a·x[i]` with `x` in f16 (a cached value) and the accumulator `y` in f32.
pub fn axpy_f16(a: f32, x: &[f16], y: &mut [f32]) {
    assert_eq!(x.len(), y.len(), "axpy_f16: length mismatch");
    // SAFETY: as above.
    unsafe { axpy_f16_on(active_isa(), a, x, y) }
}

/// # Safety
/// `isa` must run on this CPU; `x.len() == y.len()`.
pub(crate) unsafe fn dot_f16_on(isa: Isa, x: &[f16], y: &[f32]) -> f32 {
    dispatch!(isa, dot(x, y))
}

/// # Safety
/// As [`dot_f16_on`].
pub(crate) unsafe fn axpy_f16_on(isa: Isa, a: f32, x: &[f16], y: &mut [f32]) {
    dispatch!(isa, axpy(a, x, y))
}

#[cfg(any(test, feature = "parity"))]
pub(crate) fn parity(isa: Isa) -> crate::test_util::Check {
    use crate::test_util::*;
    for &n in &AWKWARD_SIZES {
        let x: Vec<f16> = random_vec(n as u64, n)
            .iter()
            .map(|&v| f16::from_f32(v))
            .collect();
        let y = random_vec(n as u64 + 9, n);
        // SAFETY (all `_on` calls): `isa` comes from the runnable list.
        let got = unsafe { dot_f16_on(isa, &x, &y) };
        canonical(isa, &[got], &[scalar::dot(&x, &y)], n as f32, &|| {
            format!("dot_f16 n={n}")
        })?;
        let mut expected = y.clone();
        let mut got = y.clone();
        scalar::axpy(-1.5, &x, &mut expected);
        unsafe { axpy_f16_on(isa, -1.5, &x, &mut got) };
        canonical(isa, &got, &expected, 3.0, &|| format!("axpy_f16 n={n}"))?;
    }
    Ok(())
}
