//! RMSNorm: `out[i] = x[i] / sqrt(mean(x²) + eps) * weight[i]`.

crate::isa::isa_modules!(scalar, x86, quad);

use crate::isa::{active_isa, dispatch, Isa};

pub fn rmsnorm(x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) {
    check_shapes(x, weight, out);
    // SAFETY: active_isa() only returns ISAs validated against this CPU.
    unsafe { rmsnorm_on(active_isa(), x, weight, eps, out) }
}

/// # Safety
/// `isa` must run on this CPU.
pub(crate) unsafe fn rmsnorm_on(isa: Isa, x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) {
    dispatch!(isa, rmsnorm(x, weight, eps, out))
}

pub(crate) fn check_shapes(x: &[f32], weight: &[f32], out: &[f32]) {
    assert_eq!(
        x.len(),
        weight.len(),
        "rmsnorm: x and weight differ in length"
    );
    assert_eq!(x.len(), out.len(), "rmsnorm: x and out differ in length");
}

#[cfg(any(test, feature = "parity"))]
pub(crate) fn parity(isa: Isa) -> crate::test_util::Check {
    use crate::test_util::*;
    for &n in &AWKWARD_SIZES {
        let x = random_vec(n as u64, n);
        let w = random_vec(n as u64 + 1, n);
        let mut expected = vec![0.0; n];
        let mut got = vec![0.0; n];
        scalar::rmsnorm(&x, &w, 1e-5, &mut expected);
        // SAFETY: `isa` comes from the runnable list.
        unsafe { rmsnorm_on(isa, &x, &w, 1e-5, &mut got) };
        if is_canonical(isa) {
            canonical(isa, &got, &expected, 0.0, &|| format!("rmsnorm n={n}"))?;
        }
        for (i, (g, e)) in got.iter().zip(&expected).enumerate() {
            // Outputs are O(|w| * |x| / rms): relative 1e-5 is the stated tolerance.
            close(*g, *e, e.abs(), &|| format!("rmsnorm n={n} [{i}]"))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unit_rms_is_identity() {
        let x = [1.0, -1.0, 1.0, -1.0];
        let mut out = [0.0; 4];
        scalar::rmsnorm(&x, &[1.0; 4], 0.0, &mut out);
        assert_eq!(out, x);
    }
}
