//! Reference f32 dot / axpy / scale / mul, in the canonical operation order.

use crate::canon;

/// Canonical 16-lane FMA reduction (see `crate::canon`).
pub fn dot_f32(x: &[f32], y: &[f32]) -> f32 {
    canon::dot(x, y, |v| v)
}

pub fn axpy_f32(a: f32, x: &[f32], y: &mut [f32]) {
    for (yi, xi) in y.iter_mut().zip(x) {
        *yi = canon::fma(a, *xi, *yi);
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
