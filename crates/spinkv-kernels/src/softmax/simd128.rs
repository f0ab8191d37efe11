//! WASM SIMD128 softmax pieces with the softmax polynomial exp.

use crate::simd::simd128::{exp_softmax, hmax, hsum};
use core::arch::wasm32::*;

/// # Safety
/// None beyond the slice (simd128 is compile-time).
pub unsafe fn max_f32(x: &[f32]) -> f32 {
    let n = x.len();
    let mut vmax = f32x4_splat(f32::NEG_INFINITY);
    let mut i = 0;
    while i + 4 <= n {
        // SAFETY: i + 4 <= n.
        vmax = f32x4_max(vmax, unsafe { v128_load(x.as_ptr().add(i) as *const v128) });
        i += 4;
    }
    x[i..].iter().copied().fold(hmax(vmax), f32::max)
}

/// # Safety
/// None beyond the slice.
pub unsafe fn exp_sub_sum(x: &mut [f32], m: f32) -> f32 {
    let n = x.len();
    let p = x.as_mut_ptr();
    let vm = f32x4_splat(m);
    let mut vsum = f32x4_splat(0.0);
    let mut i = 0;
    while i + 4 <= n {
        // SAFETY: i + 4 <= n.
        unsafe {
            let e = exp_softmax(f32x4_sub(v128_load(p.add(i) as *const v128), vm));
            v128_store(p.add(i) as *mut v128, e);
            vsum = f32x4_add(vsum, e);
        }
        i += 4;
    }
    let mut sum = hsum(vsum);
    for v in &mut x[i..] {
        *v = (*v - m).exp();
        sum += *v;
    }
    sum
}
