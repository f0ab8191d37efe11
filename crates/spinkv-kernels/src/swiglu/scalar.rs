//! Reference SwiGLU with the canonical exp (see `crate::canon`).

pub fn swiglu(gate: &mut [f32], up: &[f32]) {
    for (g, u) in gate.iter_mut().zip(up) {
        *g = *g / (1.0 + crate::canon::exp(-*g)) * u;
    }
}
