//! AVX2 RMSNorm: canonical sum of squares (see `crate::canon`), then the scale.

use crate::simd::avx2::dot16;
use std::arch::x86_64::*;

/// # Safety
/// CPU must support AVX2+FMA+F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn rmsnorm(x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) {
    super::check_shapes(x, weight, out);
    let n = x.len();
    let n8 = n / 8 * 8;
    // SAFETY: x holds n elements.
    let sum = unsafe { dot16(x.as_ptr(), x.as_ptr(), n) };
    let inv_rms = 1.0 / (sum / n.max(1) as f32 + eps).sqrt();
    let scale = _mm256_set1_ps(inv_rms);
    let mut i = 0;
    while i < n8 {
        // SAFETY: i + 8 <= n8 <= n.
        unsafe {
            let v = _mm256_mul_ps(_mm256_loadu_ps(x.as_ptr().add(i)), scale);
            let g = _mm256_loadu_ps(weight.as_ptr().add(i));
            _mm256_storeu_ps(out.as_mut_ptr().add(i), _mm256_mul_ps(v, g));
        }
        i += 8;
    }
    for j in n8..n {
        out[j] = x[j] * inv_rms * weight[j];
    }
}
