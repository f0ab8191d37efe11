//! WASM SIMD128 FWHT: the stages with `h < 4` inside each 4-lane vector, the others as vector
//! butterflies across blocks. Bit-identical to scalar.

use core::arch::wasm32::*;

/// # Safety
/// `x.len() == signs.len()`, a power of two.
pub unsafe fn signed_fwht(x: &mut [f32], signs: &[f32]) {
    if x.len() < 4 {
        return super::scalar::signed_fwht(x, signs);
    }
    // SAFETY: lengths checked by the caller.
    unsafe {
        crate::vec_f32::simd128::mul_f32(x, signs);
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
        crate::vec_f32::simd128::mul_f32(x, signs);
    }
}

unsafe fn fwht(x: &mut [f32]) {
    let n = x.len();
    let p = x.as_mut_ptr() as *mut v128;
    let odd = u32x4(0, !0, 0, !0);
    let upper = u32x4(0, 0, !0, !0);
    // SAFETY (all loads and stores): indices stay below n, a multiple of 4.
    unsafe {
        for i in 0..n / 4 {
            let mut v = v128_load(p.add(i));
            let t = i32x4_shuffle::<1, 0, 3, 2>(v, v);
            v = v128_bitselect(f32x4_sub(t, v), f32x4_add(v, t), odd);
            let t = i32x4_shuffle::<2, 3, 0, 1>(v, v);
            v = v128_bitselect(f32x4_sub(t, v), f32x4_add(v, t), upper);
            v128_store(p.add(i), v);
        }
        let mut h = 4;
        while h < n {
            for block in (0..n).step_by(2 * h) {
                for i in (block..block + h).step_by(4) {
                    let u = v128_load(p.add(i / 4));
                    let v = v128_load(p.add((i + h) / 4));
                    v128_store(p.add(i / 4), f32x4_add(u, v));
                    v128_store(p.add((i + h) / 4), f32x4_sub(u, v));
                }
            }
            h *= 2;
        }
        crate::vec_f32::simd128::scale_f32(x, 1.0 / (n as f32).sqrt());
    }
}
