//! AVX2 SwiGLU with the shared vector exp.

use crate::simd::avx2::exp;
use std::arch::x86_64::*;

/// # Safety
/// CPU must support AVX2+FMA+F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn swiglu(gate: &mut [f32], up: &[f32]) {
    assert_eq!(gate.len(), up.len());
    let n = gate.len();
    let one = _mm256_set1_ps(1.0);
    let mut i = 0;
    while i + 8 <= n {
        // SAFETY: i + 8 <= n for both slices.
        unsafe {
            let g = _mm256_loadu_ps(gate.as_ptr().add(i));
            let u = _mm256_loadu_ps(up.as_ptr().add(i));
            // exp saturates near f32::MAX for g < -88, so silu(g) rounds to ~0 as in the scalar path.
            let denom = _mm256_add_ps(one, exp(_mm256_sub_ps(_mm256_setzero_ps(), g)));
            _mm256_storeu_ps(
                gate.as_mut_ptr().add(i),
                _mm256_mul_ps(_mm256_div_ps(g, denom), u),
            );
        }
        i += 8;
    }
    for j in i..n {
        gate[j] = gate[j] / (1.0 + crate::canon::exp(-gate[j])) * up[j];
    }
}
