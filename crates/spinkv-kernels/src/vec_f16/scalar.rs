//! Reference mixed f16/f32 dot / axpy.

use half::f16;

pub fn dot_f16(x: &[f16], y: &[f32]) -> f32 {
    x.iter().zip(y).map(|(a, b)| a.to_f32() * b).sum()
}

pub fn axpy_f16(a: f32, x: &[f16], y: &mut [f32]) {
    for (yi, xi) in y.iter_mut().zip(x) {
        *yi += a * xi.to_f32();
    }
}
