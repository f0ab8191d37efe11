//! AVX-512 RMSNorm: canonical sum of squares (see `crate::canon`), then the scale; masked tails.

use crate::simd::avx512::{dot16, tail_mask};
use std::arch::x86_64::*;

/// # Safety
/// CPU must support AVX-512 F/BW/VL (+AVX2/FMA/F16C).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
pub unsafe fn rmsnorm(x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) {
    super::check_shapes(x, weight, out);
    let n = x.len();
    let (xp, wp, op) = (x.as_ptr(), weight.as_ptr(), out.as_mut_ptr());
    // SAFETY: full accesses stay below n; masked ones touch only lanes below n. All three
    // slices have length n.
    unsafe {
        let sum = dot16(xp, xp, n);
        let scale = _mm512_set1_ps(1.0 / (sum / n.max(1) as f32 + eps).sqrt());
        let mut i = 0;
        while i < n {
            let m = tail_mask((n - i).min(16));
            let v = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, xp.add(i)), scale);
            let g = _mm512_maskz_loadu_ps(m, wp.add(i));
            _mm512_mask_storeu_ps(op.add(i), m, _mm512_mul_ps(v, g));
            i += 16;
        }
    }
}
