//! NEON / SIMD128 FWHT, one body for both 4-lane ISAs: the stages with `h < 4` inside each
//! 4-lane vector (`quad::fwht4`), the others as vector butterflies across blocks.
//! Bit-identical to scalar (no products to fuse).

use crate::simd::quad;

/// # Safety
/// NEON or SIMD128 (whichever this build has); `x.len() == signs.len()`, a power of two.
pub unsafe fn signed_fwht(x: &mut [f32], signs: &[f32]) {
    if x.len() < 4 {
        return super::scalar::signed_fwht(x, signs);
    }
    // SAFETY: lengths checked by the caller.
    unsafe {
        crate::vec_f32::quad::mul_f32(x, signs);
        fwht(x);
    }
}

/// # Safety
/// As [`signed_fwht`].
pub unsafe fn fwht_signed(x: &mut [f32], signs: &[f32]) {
    if x.len() < 4 {
        return super::scalar::fwht_signed(x, signs);
    }
    // SAFETY: as above.
    unsafe {
        fwht(x);
        crate::vec_f32::quad::mul_f32(x, signs);
    }
}

unsafe fn fwht(x: &mut [f32]) {
    let n = x.len();
    let p = x.as_mut_ptr();
    // SAFETY (all loads and stores): indices stay below n, a multiple of 4.
    unsafe {
        for i in (0..n).step_by(4) {
            quad::store(p.add(i), quad::fwht4(quad::load(p.add(i))));
        }
        let mut h = 4;
        while h < n {
            for block in (0..n).step_by(2 * h) {
                for i in (block..block + h).step_by(4) {
                    let u = quad::load(p.add(i));
                    let v = quad::load(p.add(i + h));
                    quad::store(p.add(i), quad::add(u, v));
                    quad::store(p.add(i + h), quad::sub(u, v));
                }
            }
            h *= 2;
        }
        crate::vec_f32::quad::scale_f32(x, 1.0 / (n as f32).sqrt());
    }
}
