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
        blocks::<V>(x.len(), |i, n| {
            if n == V::N {
                V::store(yp.add(i), V::fma(va, V::widen(xp.add(i)), V::load(yp.add(i))));
            } else {
                let m = V::mask(n);
                let v = V::fma(va, V::widen_part(xp.add(i), n), V::load_masked(yp.add(i), m));
                V::store_masked(yp.add(i), m, v);
            }
        });
    }
}

/// `x[i] = op(x[i], y[i])` (`y` = `x` itself for an in-place scale).
///
/// # Safety
/// `V`'s features; `x` and `y` valid for `n` elements.
#[inline(always)]
unsafe fn map<V: Vector>(x: *mut f32, y: *const f32, n: usize, op: impl Fn(V, V) -> V) {
    // SAFETY: each block (whole, or masked to its lanes) lies inside both buffers.
    blocks::<V>(n, |i, nb| unsafe {
        if nb == V::N {
            V::store(x.add(i), op(V::load(x.add(i)), V::load(y.add(i))));
        } else {
            let m = V::mask(nb);
            V::store_masked(x.add(i), m, op(V::load_masked(x.add(i), m), V::load_masked(y.add(i), m)));
        }
    });
}

/// # Safety
/// `V`'s features.
#[inline(always)]
unsafe fn scale_f32<V: Vector>(x: &mut [f32], a: f32) {
    // SAFETY: in place over x; `V`'s features (caller).
    unsafe {
        let va = V::splat(a);
        map::<V>(x.as_mut_ptr(), x.as_ptr(), x.len(), |v, _| V::mul(v, va));
    }
}

/// # Safety
/// `V`'s features; `x.len() == y.len()`.
#[inline(always)]
unsafe fn mul_f32<V: Vector>(x: &mut [f32], y: &[f32]) {
    assert_eq!(x.len(), y.len());
    // SAFETY: both slices hold x.len() elements; `V`'s features (caller).
    unsafe { map::<V>(x.as_mut_ptr(), y.as_ptr(), x.len(), |a, b| V::mul(a, b)) }
}
