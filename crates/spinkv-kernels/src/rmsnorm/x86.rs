//! AVX2 / AVX-512 RMSNorm: canonical sum of squares (`dot16`, see `crate::canon`), then the
//! scale, partial tails.

use crate::simd::x86::{blocks, dot16, Vector};

crate::isa::x86_kernels! {
    fn rmsnorm(x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]);
}

/// # Safety
/// `V`'s features.
#[inline(always)]
unsafe fn rmsnorm<V: Vector>(x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) {
    super::check_shapes(x, weight, out);
    let n = x.len();
    let (xp, wp, op) = (x.as_ptr(), weight.as_ptr(), out.as_mut_ptr());
    // SAFETY: all three slices have length n; each block (whole, or masked to its lanes)
    // stays below n.
    unsafe {
        let sum = dot16::<V, f32>(xp, xp, n);
        let scale = V::splat(1.0 / (sum / n.max(1) as f32 + eps).sqrt());
        for (i, nb) in blocks::<V>(n) {
            if nb == V::N {
                let v = V::mul(V::load(xp.add(i)), scale);
                V::store(op.add(i), V::mul(v, V::load(wp.add(i))));
            } else {
                let m = V::mask(nb);
                let v = V::mul(V::load_masked(xp.add(i), m), scale);
                V::store_masked(op.add(i), m, V::mul(v, V::load_masked(wp.add(i), m)));
            }
        }
    }
}
