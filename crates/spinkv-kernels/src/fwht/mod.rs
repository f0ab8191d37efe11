//! Orthonormal fast Walsh–Hadamard transform with Rademacher signs, the rotation of the
//! TurboQuant codecs: `signed_fwht`: `x ← H·(s ⊙ x)/√n`; `fwht_signed`: `x ← s ⊙ (H·x)/√n`
//! (its inverse). `n` is a power of two.
//!
//! Every ISA runs the same butterflies (`u + v`, `u - v`) on the same operands in the same
//! stage order, then the same scaling: the outputs are bit-identical to the scalar reference,
//! which keeps encoded pages identical across ISAs.

crate::isa::isa_modules!(scalar, avx2, avx512, quad);

use crate::isa::{active_isa, dispatch, Isa};

/// `x ← H·(signs ⊙ x)/√n`.
pub fn signed_fwht(x: &mut [f32], signs: &[f32]) {
    check(x, signs);
    // SAFETY: active_isa() only returns ISAs validated against this CPU; shapes checked.
    unsafe { signed_fwht_on(active_isa(), x, signs) }
}

/// `x ← signs ⊙ (H·x)/√n`, the inverse of [`signed_fwht`].
pub fn fwht_signed(x: &mut [f32], signs: &[f32]) {
    check(x, signs);
    // SAFETY: as above.
    unsafe { fwht_signed_on(active_isa(), x, signs) }
}

fn check(x: &[f32], signs: &[f32]) {
    assert!(
        x.len().is_power_of_two(),
        "fwht: length must be a power of two"
    );
    assert_eq!(x.len(), signs.len(), "fwht: signs differ in length");
}

/// # Safety
/// `isa` must run on this CPU; shapes as checked by [`signed_fwht`].
pub(crate) unsafe fn signed_fwht_on(isa: Isa, x: &mut [f32], signs: &[f32]) {
    dispatch!(isa, signed_fwht(x, signs))
}

/// # Safety
/// As [`signed_fwht_on`].
pub(crate) unsafe fn fwht_signed_on(isa: Isa, x: &mut [f32], signs: &[f32]) {
    dispatch!(isa, fwht_signed(x, signs))
}

#[cfg(any(test, feature = "parity"))]
pub(crate) fn parity(isa: Isa) -> crate::test_util::Check {
    use crate::test_util::*;
    let mut rng = Rng::new(9);
    for n in (0..=11).map(|k| 1usize << k) {
        let signs: Vec<f32> = (0..n)
            .map(|_| if rng.next_u64() & 1 == 1 { 1.0 } else { -1.0 })
            .collect();
        let x = random_vec(rng.next_u64(), n);
        let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
        let (mut want, mut got) = (x.clone(), x.clone());
        scalar::signed_fwht(&mut want, &signs);
        // SAFETY (both `_on` calls): `isa` comes from the runnable list.
        unsafe { signed_fwht_on(isa, &mut got, &signs) };
        identical(&bits(&got), &bits(&want), &|| format!("signed_fwht n={n}"))?;
        scalar::fwht_signed(&mut want, &signs);
        unsafe { fwht_signed_on(isa, &mut got, &signs) };
        identical(&bits(&got), &bits(&want), &|| format!("fwht_signed n={n}"))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spreads_a_spike_and_inverts() {
        let signs = vec![1.0f32; 16];
        let mut x = vec![0.0f32; 16];
        x[3] = 1.0;
        signed_fwht(&mut x, &signs);
        assert!(x.iter().all(|v| (v.abs() - 0.25).abs() < 1e-7));
        fwht_signed(&mut x, &signs);
        assert!((x[3] - 1.0).abs() < 1e-6 && x.iter().map(|v| v.abs()).sum::<f32>() < 1.0 + 1e-5);
    }
}
