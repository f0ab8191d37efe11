//! AVX2 RMSNorm: vectorised sum of squares (two accumulators) and scale.

use crate::simd::avx2::hsum;
use std::arch::x86_64::*;

/// # Safety
/// CPU must support AVX2+FMA+F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn rmsnorm(x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) {
    super::check_shapes(x, weight, out);
    let n = x.len();
    let n8 = n / 8 * 8;
    let (mut acc0, mut acc1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
    let mut i = 0;
    // SAFETY: every 8-lane access below has i + 8 <= n; all three slices have length n.
    unsafe {
        while i + 16 <= n {
            let a = _mm256_loadu_ps(x.as_ptr().add(i));
            let b = _mm256_loadu_ps(x.as_ptr().add(i + 8));
            acc0 = _mm256_fmadd_ps(a, a, acc0);
            acc1 = _mm256_fmadd_ps(b, b, acc1);
            i += 16;
        }
        if i < n8 {
            let a = _mm256_loadu_ps(x.as_ptr().add(i));
            acc0 = _mm256_fmadd_ps(a, a, acc0);
        }
    }
    let mut sum = hsum(_mm256_add_ps(acc0, acc1));
    sum += x[n8..].iter().map(|v| v * v).sum::<f32>();
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
