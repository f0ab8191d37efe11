//! Reference dot / axpy (f32 or f16 rows against f32) / scale / mul, in the canonical
//! operation order.

use crate::canon;
use crate::simd::Lanes;

/// Canonical 16-lane FMA reduction (see `crate::canon`), `x` widened to f32.
pub fn dot<L: Lanes>(x: &[L], y: &[f32]) -> f32 {
    canon::dot(x, y, L::widen)
}

pub fn axpy<L: Lanes>(a: f32, x: &[L], y: &mut [f32]) {
    for (yi, xi) in y.iter_mut().zip(x) {
        *yi = canon::fma(a, xi.widen(), *yi);
    }
}

pub fn scale_f32(x: &mut [f32], a: f32) {
    for v in x {
        *v *= a;
    }
}

pub fn mul_f32(x: &mut [f32], y: &[f32]) {
    for (a, b) in x.iter_mut().zip(y) {
        *a *= b;
    }
}
