//! SwiGLU activation in place: `gate[i] = silu(gate[i]) * up[i]`, `silu(g) = g / (1 + e^-g)`.

crate::isa::isa_modules!(scalar, avx2, avx512, neon, simd128);

use crate::isa::{active_isa, dispatch, Isa};

pub fn swiglu(gate: &mut [f32], up: &[f32]) {
    assert_eq!(gate.len(), up.len(), "swiglu: gate and up differ in length");
    // SAFETY: active_isa() only returns ISAs validated against this CPU.
    unsafe { swiglu_on(active_isa(), gate, up) }
}

/// # Safety
/// `isa` must run on this CPU; equal lengths.
pub(crate) unsafe fn swiglu_on(isa: Isa, gate: &mut [f32], up: &[f32]) {
    dispatch!(isa, swiglu(gate, up))
}

#[cfg(any(test, feature = "parity"))]
pub(crate) fn parity(isa: Isa) -> crate::test_util::Check {
    use crate::test_util::*;
    for &n in &AWKWARD_SIZES {
        let gate: Vec<f32> = random_vec(n as u64, n).iter().map(|v| v * 20.0).collect();
        let up = random_vec(n as u64 + 3, n);
        let mut expected = gate.clone();
        let mut got = gate.clone();
        scalar::swiglu(&mut expected, &up);
        // SAFETY: `isa` comes from the runnable list.
        unsafe { swiglu_on(isa, &mut got, &up) };
        if is_canonical(isa) {
            canonical(isa, &got, &expected, 0.0, &|| format!("swiglu n={n}"))?;
        }
        for (i, (g, e)) in got.iter().zip(&expected).enumerate() {
            if (g - e).abs() > 1e-6 + 1e-5 * e.abs() {
                return Err(format!("swiglu n={n} [{i}]: {g} vs {e}"));
            }
        }
    }
    Ok(())
}
