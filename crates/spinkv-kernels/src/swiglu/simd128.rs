//! WASM SIMD128 SwiGLU with the shared vector exp.

use crate::simd::simd128::exp;
use core::arch::wasm32::*;

/// # Safety
/// Equal lengths.
pub unsafe fn swiglu(gate: &mut [f32], up: &[f32]) {
    assert_eq!(gate.len(), up.len());
    let n = gate.len();
    let one = f32x4_splat(1.0);
    let mut i = 0;
    while i + 4 <= n {
        // SAFETY: i + 4 <= n for both slices.
        unsafe {
            let g = v128_load(gate.as_ptr().add(i) as *const v128);
            let u = v128_load(up.as_ptr().add(i) as *const v128);
            let denom = f32x4_add(one, exp(f32x4_neg(g)));
            v128_store(
                gate.as_mut_ptr().add(i) as *mut v128,
                f32x4_mul(f32x4_div(g, denom), u),
            );
        }
        i += 4;
    }
    for j in i..n {
        gate[j] = gate[j] / (1.0 + crate::canon::exp(-gate[j])) * up[j];
    }
}
