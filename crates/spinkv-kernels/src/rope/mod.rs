//! Rotary position embedding in the Hugging Face "rotate_half" layout: within each head the
//! pair is `(x[i], x[i + head_dim/2])`, not adjacent lanes as in the interleaved GGUF layout.
//!
//! `out[i] = x[i]·cos[i] - x[i+h]·sin[i]`, `out[i+h] = x[i+h]·cos[i] + x[i]·sin[i]`, h = head_dim/2.

crate::isa::isa_modules!(scalar, avx2, avx512, quad);

use crate::isa::{active_isa, dispatch, Isa};
use std::ops::Range;

/// Rotate every head of one token in place. `x`: `[n_heads, head_dim]`;
/// `cos`, `sin`: `[head_dim / 2]` for this token's position.
pub fn rope(x: &mut [f32], head_dim: usize, cos: &[f32], sin: &[f32]) {
    check_shapes(x, head_dim, cos, sin);
    // SAFETY: active_isa() only returns ISAs validated against this CPU.
    unsafe { rope_on(active_isa(), x, head_dim, cos, sin) }
}

/// # Safety
/// `isa` must run on this CPU.
pub(crate) unsafe fn rope_on(isa: Isa, x: &mut [f32], head_dim: usize, cos: &[f32], sin: &[f32]) {
    dispatch!(isa, rope(x, head_dim, cos, sin))
}

pub(crate) fn check_shapes(x: &[f32], head_dim: usize, cos: &[f32], sin: &[f32]) {
    assert!(
        head_dim > 0 && head_dim.is_multiple_of(2),
        "rope: head_dim must be even and positive"
    );
    assert_eq!(x.len() % head_dim, 0, "rope: x is not [n_heads, head_dim]");
    assert_eq!(cos.len(), head_dim / 2, "rope: cos is not [head_dim / 2]");
    assert_eq!(sin.len(), head_dim / 2, "rope: sin is not [head_dim / 2]");
}

/// cos/sin tables `[positions.len(), head_dim / 2]` for `theta` (the config's rope_theta) with
/// linear position scaling (`position / linear_factor`; 1.0 = none). Computed in f64 so long
/// contexts do not lose the phase.
pub fn rope_tables(
    head_dim: usize,
    theta: f64,
    linear_factor: f64,
    positions: Range<usize>,
) -> (Vec<f32>, Vec<f32>) {
    let half = head_dim / 2;
    let inv_freq: Vec<f64> = (0..half)
        .map(|i| 1.0 / theta.powf((2 * i) as f64 / head_dim as f64))
        .collect();
    let mut cos = Vec::with_capacity(positions.len() * half);
    let mut sin = Vec::with_capacity(positions.len() * half);
    for pos in positions {
        let scaled = pos as f64 / linear_factor;
        for &f in &inv_freq {
            let angle = scaled * f;
            cos.push(angle.cos() as f32);
            sin.push(angle.sin() as f32);
        }
    }
    (cos, sin)
}

#[cfg(any(test, feature = "parity"))]
pub(crate) fn parity(isa: Isa) -> crate::test_util::Check {
    use crate::test_util::*;
    for &half in &AWKWARD_SIZES {
        let head_dim = half * 2;
        let (cos, sin) = rope_tables(head_dim, 10000.0, 1.0, 37..38);
        let x = random_vec(half as u64, 3 * head_dim);
        let mut expected = x.clone();
        let mut got = x.clone();
        scalar::rope(&mut expected, head_dim, &cos, &sin);
        // SAFETY: `isa` comes from the runnable list.
        unsafe { rope_on(isa, &mut got, head_dim, &cos, &sin) };
        canonical(isa, &got, &expected, 2.0, &|| {
            format!("rope head_dim={head_dim}")
        })?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rotate_half_layout() {
        // head_dim 4, angle pi/2 on pair 0 (inv_freq[0] = 1): (x0, x2) rotates by 90 degrees.
        let cos = [0.0, 1.0];
        let sin = [1.0, 0.0];
        let mut x = [1.0, 2.0, 3.0, 4.0];
        scalar::rope(&mut x, 4, &cos, &sin);
        assert_eq!(x, [-3.0, 2.0, 1.0, 4.0]);
    }

    #[test]
    fn position_zero_is_identity_and_scaling_divides_positions() {
        let (cos, sin) = rope_tables(8, 10000.0, 1.0, 0..1);
        assert!(cos.iter().all(|&c| c == 1.0) && sin.iter().all(|&s| s == 0.0));
        let (c_scaled, _) = rope_tables(8, 10000.0, 4.0, 8..9);
        let (c_plain, _) = rope_tables(8, 10000.0, 1.0, 2..3);
        assert_eq!(c_scaled, c_plain);
    }
}
