//! SwiGLU activation in place: `gate[i] = silu(gate[i]) * up[i]`, `silu(g) = g / (1 + e^-g)`.

pub mod scalar;

#[cfg(target_arch = "x86_64")]
pub mod avx2;

pub fn swiglu(gate: &mut [f32], up: &[f32]) {
    assert_eq!(gate.len(), up.len(), "swiglu: gate and up differ in length");
    #[cfg(target_arch = "x86_64")]
    if crate::isa::use_avx2() {
        // SAFETY: AVX2/FMA/F16C were verified before use_avx2() could be true.
        unsafe { avx2::swiglu(gate, up) };
        return;
    }
    scalar::swiglu(gate, up)
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
            let gate: Vec<f32> = random_vec(n as u64, n).iter().map(|v| v * 20.0).collect();
            let up = random_vec(n as u64 + 3, n);
            let mut expected = gate.clone();
            let mut got = gate.clone();
            scalar::swiglu(&mut expected, &up);
            // SAFETY: CPU support checked above.
            unsafe { avx2::swiglu(&mut got, &up) };
            for (g, e) in got.iter().zip(&expected) {
                assert!(
                    (g - e).abs() <= 1e-6 + 1e-5 * e.abs(),
                    "swiglu n={n}: {g} vs {e}"
                );
            }
        }
    }
}
