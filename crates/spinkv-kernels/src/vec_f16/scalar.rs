//! Reference mixed f16/f32 dot / axpy.

use half::f16;

/// Canonical 16-lane FMA reduction (see `crate::canon`).
pub fn dot_f16(x: &[f16], y: &[f32]) -> f32 {
    crate::canon::dot(x, y, |v| v.to_f32())
}

pub fn axpy_f16(a: f32, x: &[f16], y: &mut [f32]) {
    for (yi, xi) in y.iter_mut().zip(x) {
        *yi = crate::canon::fma(a, xi.to_f32(), *yi);
    }
}
