//! f32 vector primitives used by attention: `dot_f32` and `axpy_f32` (`y += a·x`). The
//! per-ISA dot and axpy are generic over the row dtype and also serve `vec_f16`.

crate::isa::isa_modules!(scalar, x86, quad);

use crate::isa::{active_isa, dispatch, Isa};

pub fn dot_f32(x: &[f32], y: &[f32]) -> f32 {
    assert_eq!(x.len(), y.len(), "dot_f32: length mismatch");
    // SAFETY: active_isa() only returns ISAs validated against this CPU.
    unsafe { dot_f32_on(active_isa(), x, y) }
}

/// `y[i] += a * x[i]`.
pub fn axpy_f32(a: f32, x: &[f32], y: &mut [f32]) {
    assert_eq!(x.len(), y.len(), "axpy_f32: length mismatch");
    // SAFETY: as above.
    unsafe { axpy_f32_on(active_isa(), a, x, y) }
}

/// `x[i] *= a`.
pub fn scale_f32(x: &mut [f32], a: f32) {
    // SAFETY: as above.
    unsafe { scale_f32_on(active_isa(), x, a) }
}

/// `x[i] *= y[i]`.
pub fn mul_f32(x: &mut [f32], y: &[f32]) {
    assert_eq!(x.len(), y.len(), "mul_f32: length mismatch");
    // SAFETY: as above.
    unsafe { mul_f32_on(active_isa(), x, y) }
}

/// # Safety
/// `isa` must run on this CPU (see [`crate::runnable_isas`]); `x.len() == y.len()`.
pub(crate) unsafe fn dot_f32_on(isa: Isa, x: &[f32], y: &[f32]) -> f32 {
    dispatch!(isa, dot(x, y))
}

/// # Safety
/// As [`dot_f32_on`].
pub(crate) unsafe fn axpy_f32_on(isa: Isa, a: f32, x: &[f32], y: &mut [f32]) {
    dispatch!(isa, axpy(a, x, y))
}

/// # Safety
/// `isa` must run on this CPU.
pub(crate) unsafe fn scale_f32_on(isa: Isa, x: &mut [f32], a: f32) {
    dispatch!(isa, scale_f32(x, a))
}

/// # Safety
/// `isa` must run on this CPU; `x.len() == y.len()`.
pub(crate) unsafe fn mul_f32_on(isa: Isa, x: &mut [f32], y: &[f32]) {
    dispatch!(isa, mul_f32(x, y))
}

#[cfg(any(test, feature = "parity"))]
pub(crate) fn parity(isa: Isa) -> crate::test_util::Check {
    use crate::test_util::*;
    for &n in &AWKWARD_SIZES {
        let x = random_vec(n as u64, n);
        let y = random_vec(n as u64 + 5, n);
        // SAFETY (all `_on` calls): `isa` comes from the runnable list.
        let got = unsafe { dot_f32_on(isa, &x, &y) };
        canonical(isa, &[got], &[scalar::dot(&x, &y)], n as f32, &|| {
            format!("dot_f32 n={n}")
        })?;
        let mut expected = y.clone();
        let mut got = y.clone();
        scalar::axpy(0.37, &x, &mut expected);
        unsafe { axpy_f32_on(isa, 0.37, &x, &mut got) };
        canonical(isa, &got, &expected, 2.0, &|| format!("axpy_f32 n={n}"))?;
        let mut expected = x.clone();
        let mut got = x.clone();
        scalar::scale_f32(&mut expected, -0.7);
        unsafe { scale_f32_on(isa, &mut got, -0.7) };
        identical(&got, &expected, &|| format!("scale_f32 n={n}"))?;
        scalar::mul_f32(&mut expected, &y);
        unsafe { mul_f32_on(isa, &mut got, &y) };
        identical(&got, &expected, &|| format!("mul_f32 n={n}"))?;
    }
    Ok(())
}
