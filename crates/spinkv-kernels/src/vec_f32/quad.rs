//! NEON / SIMD128 dot / axpy of f32 or f16 rows against f32, scale, mul: one body for both
//! 4-lane ISAs. `quad::mul_add` fuses on NEON only (SIMD128 has no FMA), and the dot product
//! is the ISA's own (`quad::dot`): NEON's is canonical, SIMD128's keeps its historical order.

use crate::simd::quad::{self, Lanes};

/// # Safety
/// NEON or SIMD128 (whichever this build has); `x.len() == y.len()`.
pub unsafe fn dot<L: Lanes>(x: &[L], y: &[f32]) -> f32 {
    assert_eq!(x.len(), y.len());
    // SAFETY: both slices hold x.len() elements.
    unsafe { quad::dot(x.as_ptr(), y.as_ptr(), x.len()) }
}

/// # Safety
/// As [`dot`].
pub unsafe fn axpy<L: Lanes>(a: f32, x: &[L], y: &mut [f32]) {
    assert_eq!(x.len(), y.len());
    let n = x.len();
    let (xp, yp) = (x.as_ptr(), y.as_mut_ptr());
    let mut i = 0;
    // SAFETY: i + 4 <= n for both slices.
    unsafe {
        let va = quad::splat(a);
        while i + 4 <= n {
            let v = quad::mul_add(va, L::load4(xp.add(i)), quad::load(yp.add(i)));
            quad::store(yp.add(i), v);
            i += 4;
        }
    }
    for j in i..n {
        y[j] = quad::mul_add_f32(a, x[j].widen(), y[j]);
    }
}

/// # Safety
/// NEON or SIMD128 (whichever this build has).
pub unsafe fn scale_f32(x: &mut [f32], a: f32) {
    let n = x.len();
    let p = x.as_mut_ptr();
    let mut i = 0;
    // SAFETY: i + 4 <= n.
    unsafe {
        let va = quad::splat(a);
        while i + 4 <= n {
            quad::store(p.add(i), quad::mul(quad::load(p.add(i)), va));
            i += 4;
        }
    }
    for v in &mut x[i..] {
        *v *= a;
    }
}

/// # Safety
/// As [`dot`].
pub unsafe fn mul_f32(x: &mut [f32], y: &[f32]) {
    assert_eq!(x.len(), y.len());
    let n = x.len();
    let (xp, yp) = (x.as_mut_ptr(), y.as_ptr());
    let mut i = 0;
    // SAFETY: i + 4 <= n for both slices.
    unsafe {
        while i + 4 <= n {
            quad::store(xp.add(i), quad::mul(quad::load(xp.add(i)), quad::load(yp.add(i))));
            i += 4;
        }
    }
    for j in i..n {
        x[j] *= y[j];
    }
}
