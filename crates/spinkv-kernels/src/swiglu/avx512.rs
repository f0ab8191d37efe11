//! AVX-512 SwiGLU with the shared vector exp, masked tails.

use crate::simd::avx512::{exp, tail_mask};
use std::arch::x86_64::*;

/// # Safety
/// CPU must support AVX-512 F/BW/VL (+AVX2/FMA/F16C); equal lengths.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
pub unsafe fn swiglu(gate: &mut [f32], up: &[f32]) {
    assert_eq!(gate.len(), up.len());
    let n = gate.len();
    let one = _mm512_set1_ps(1.0);
    let (gp, up_ptr) = (gate.as_mut_ptr(), up.as_ptr());
    let mut i = 0;
    while i < n {
        let m = tail_mask((n - i).min(16));
        // SAFETY: masked lanes stay below n for both slices.
        unsafe {
            let g = _mm512_maskz_loadu_ps(m, gp.add(i));
            let u = _mm512_maskz_loadu_ps(m, up_ptr.add(i));
            let denom = _mm512_add_ps(one, exp(_mm512_sub_ps(_mm512_setzero_ps(), g)));
            _mm512_mask_storeu_ps(gp.add(i), m, _mm512_mul_ps(_mm512_div_ps(g, denom), u));
        }
        i += 16;
    }
}
