//! AVX2 softmax pieces: the canonical softmax exp polynomial and 16-lane sum (see `crate::canon`).

use crate::simd::avx2::{exp_softmax, hmax, reduce16, tail_mask};
use std::arch::x86_64::*;

/// # Safety
/// CPU must support AVX2+FMA+F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn max_f32(x: &[f32]) -> f32 {
    let n = x.len();
    let n8 = n / 8 * 8;
    let mut vmax = _mm256_set1_ps(f32::NEG_INFINITY);
    let mut i = 0;
    while i < n8 {
        // SAFETY: i + 8 <= n.
        vmax = _mm256_max_ps(vmax, unsafe { _mm256_loadu_ps(x.as_ptr().add(i)) });
        i += 8;
    }
    x[n8..].iter().copied().fold(hmax(vmax), f32::max)
}

/// # Safety
/// CPU must support AVX2+FMA+F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn exp_sub_sum(x: &mut [f32], m: f32) -> f32 {
    let n = x.len();
    let p = x.as_mut_ptr();
    let vm = _mm256_set1_ps(m);
    // The canonical 16 lanes as two 8-lane sums.
    let (mut lo, mut hi) = (_mm256_setzero_ps(), _mm256_setzero_ps());
    let mut i = 0;
    // SAFETY: full accesses cover i..i+16 <= n; the tail's are masked to lanes below n.
    unsafe {
        while i + 16 <= n {
            let a = exp_softmax(_mm256_sub_ps(_mm256_loadu_ps(p.add(i)), vm));
            let b = exp_softmax(_mm256_sub_ps(_mm256_loadu_ps(p.add(i + 8)), vm));
            _mm256_storeu_ps(p.add(i), a);
            _mm256_storeu_ps(p.add(i + 8), b);
            lo = _mm256_add_ps(lo, a);
            hi = _mm256_add_ps(hi, b);
            i += 16;
        }
        if i < n {
            let (m_lo, m_hi) = (
                tail_mask((n - i).min(8)),
                tail_mask((n - i).saturating_sub(8)),
            );
            let a = exp_softmax(_mm256_sub_ps(_mm256_maskload_ps(p.add(i), m_lo), vm));
            let b = exp_softmax(_mm256_sub_ps(_mm256_maskload_ps(p.add(i + 8), m_hi), vm));
            let a = _mm256_and_ps(a, _mm256_castsi256_ps(m_lo));
            let b = _mm256_and_ps(b, _mm256_castsi256_ps(m_hi));
            _mm256_maskstore_ps(p.add(i), m_lo, a);
            _mm256_maskstore_ps(p.add(i + 8), m_hi, b);
            lo = _mm256_add_ps(lo, a);
            hi = _mm256_add_ps(hi, b);
        }
    }
    reduce16(lo, hi)
}

/// A block's rows are compared 8 weights at a time (the block's last `block % 8` one by one);
/// the first row that reaches its limit settles the block.
///
/// # Safety
/// CPU must support AVX2+FMA+F16C; shapes as `super::blocks_reaching` checks.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn blocks_reaching(
    x: &[f32],
    stride: usize,
    block: usize,
    blocks: usize,
    limits: &[f32],
) -> u64 {
    let p = x.as_ptr();
    let whole = block / 8 * 8;
    let mut found = 0u64;
    for b in 0..blocks {
        for (r, &limit) in limits.iter().enumerate() {
            let row = r * stride + b * block;
            let vlimit = _mm256_set1_ps(limit);
            let mut hit = _mm256_setzero_ps();
            let mut j = 0;
            while j < whole {
                // SAFETY: j + 8 <= block: the lanes lie inside row r's block b (checked by the
                // caller).
                let w = unsafe { _mm256_loadu_ps(p.add(row + j)) };
                hit = _mm256_or_ps(hit, _mm256_cmp_ps::<_CMP_GE_OQ>(w, vlimit));
                j += 8;
            }
            let reached = _mm256_movemask_ps(hit) != 0
                || x[row + whole..row + block].iter().any(|&w| w >= limit);
            if reached {
                found |= 1 << b;
                break;
            }
        }
    }
    found
}
