//! AVX2 / AVX-512 dot (canonical 16 lanes, `dot16`) and axpy of f32, f16 or bf16 rows against
//! f32 (halves widen in registers), scale, mul: one body for both widths, partial tails.

use crate::simd::x86::{blocks, dot16, Vector};
use crate::simd::Lanes;

crate::isa::x86_kernels! {
    fn dot<L: Lanes>(x: &[L], y: &[f32]) -> f32;
    fn axpy<L: Lanes>(a: f32, x: &[L], y: &mut [f32]);
    fn scale_f32(x: &mut [f32], a: f32);
    fn mul_f32(x: &mut [f32], y: &[f32]);
}

/// # Safety
/// `V`'s features; `x.len() == y.len()`.
#[inline(always)]
unsafe fn dot<V: Vector, L: Lanes>(x: &[L], y: &[f32]) -> f32 {
    assert_eq!(x.len(), y.len());
    // SAFETY: both slices hold x.len() elements.
    unsafe { dot16::<V, L>(x.as_ptr(), y.as_ptr(), x.len()) }
}

/// # Safety
/// `V`'s features; `x.len() == y.len()`.
#[inline(always)]
unsafe fn axpy<V: Vector, L: Lanes>(a: f32, x: &[L], y: &mut [f32]) {
    assert_eq!(x.len(), y.len());
    let (xp, yp) = (x.as_ptr(), y.as_mut_ptr());
    // SAFETY: each block (whole, or masked to its n lanes) lies inside both slices.
    unsafe {
        let va = V::splat(a);
        for (i, n) in blocks::<V>(x.len()) {
            if n == V::N {
                V::store(yp.add(i), V::fma(va, V::widen(xp.add(i)), V::load(yp.add(i))));
            } else {
                let m = V::mask(n);
                let v = V::fma(va, V::widen_part(xp.add(i), n), V::load_masked(yp.add(i), m));
                V::store_masked(yp.add(i), m, v);
            }
        }
    }
}

/// `x[i] *= y[i]`, or `x[i] *= a` without `y`.
///
/// # Safety
/// `V`'s features; `y`, if any, as long as `x`.
#[inline(always)]
unsafe fn mul_in_place<V: Vector>(x: &mut [f32], y: Option<&[f32]>, a: f32) {
    let xp = x.as_mut_ptr();
    // SAFETY: each block (whole, or masked to its lanes) lies inside both slices.
    unsafe {
        let va = V::splat(a);
        for (i, n) in blocks::<V>(x.len()) {
            if n == V::N {
                let f = match y {
                    Some(y) => V::load(y.as_ptr().add(i)),
                    None => va,
                };
                V::store(xp.add(i), V::mul(V::load(xp.add(i)), f));
            } else {
                let m = V::mask(n);
                let f = match y {
                    Some(y) => V::load_masked(y.as_ptr().add(i), m),
                    None => va,
                };
                V::store_masked(xp.add(i), m, V::mul(V::load_masked(xp.add(i), m), f));
            }
        }
    }
}

/// # Safety
/// `V`'s features.
#[inline(always)]
unsafe fn scale_f32<V: Vector>(x: &mut [f32], a: f32) {
    // SAFETY: `V`'s features (caller).
    unsafe { mul_in_place::<V>(x, None, a) }
}

/// # Safety
/// `V`'s features; `x.len() == y.len()`.
#[inline(always)]
unsafe fn mul_f32<V: Vector>(x: &mut [f32], y: &[f32]) {
    assert_eq!(x.len(), y.len());
    // SAFETY: equal lengths; `V`'s features (caller).
    unsafe { mul_in_place::<V>(x, Some(y), 1.0) }
}
