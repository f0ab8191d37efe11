//! AVX2 softmax with a vectorised exp (Cephes-style polynomial, ~2 ulp on the range used).

use crate::simd::avx2::{exp, hmax, hsum};
use std::arch::x86_64::*;

/// # Safety
/// CPU must support AVX2+FMA+F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn softmax_inplace(x: &mut [f32]) {
    if x.is_empty() {
        return;
    }
    let n = x.len();
    let n8 = n / 8 * 8;
    let p = x.as_mut_ptr();
    let mut vmax = _mm256_set1_ps(f32::NEG_INFINITY);
    let mut i = 0;
    while i < n8 {
        // SAFETY: i + 8 <= n.
        vmax = _mm256_max_ps(vmax, unsafe { _mm256_loadu_ps(p.add(i)) });
        i += 8;
    }
    let max = x[n8..].iter().copied().fold(hmax(vmax), f32::max);
    let vmax = _mm256_set1_ps(max);
    let mut vsum = _mm256_setzero_ps();
    let mut i = 0;
    while i < n8 {
        // SAFETY: i + 8 <= n.
        unsafe {
            let e = exp(_mm256_sub_ps(_mm256_loadu_ps(p.add(i)), vmax));
            _mm256_storeu_ps(p.add(i), e);
            vsum = _mm256_add_ps(vsum, e);
        }
        i += 8;
    }
    let mut sum = hsum(vsum);
    for v in &mut x[n8..] {
        *v = (*v - max).exp();
        sum += *v;
    }
    let inv = 1.0 / sum;
    let vinv = _mm256_set1_ps(inv);
    let mut i = 0;
    while i < n8 {
        // SAFETY: i + 8 <= n.
        unsafe { _mm256_storeu_ps(p.add(i), _mm256_mul_ps(_mm256_loadu_ps(p.add(i)), vinv)) };
        i += 8;
    }
    for v in &mut x[n8..] {
        *v *= inv;
    }
}
