//! WASM SIMD128 bulk conversions by exact integer/float bit manipulation (no hardware f16).

use crate::simd::simd128::{f16_bits_to_f32, f32_to_f16_bits};
use core::arch::wasm32::*;
use half::f16;

/// # Safety
/// `src.len() == dst.len()`.
pub unsafe fn f32_to_f16(src: &[f32], dst: &mut [f16]) {
    assert_eq!(src.len(), dst.len());
    let n = src.len();
    let (sp, dp) = (src.as_ptr(), dst.as_mut_ptr());
    let mut i = 0;
    // SAFETY: i + 8 <= n for both slices (16 bytes of halves stored).
    unsafe {
        while i + 8 <= n {
            let lo = f32_to_f16_bits(v128_load(sp.add(i) as *const v128));
            let hi = f32_to_f16_bits(v128_load(sp.add(i + 4) as *const v128));
            v128_store(dp.add(i) as *mut v128, u16x8_narrow_i32x4(lo, hi));
            i += 8;
        }
    }
    for j in i..n {
        dst[j] = f16::from_f32(src[j]);
    }
}

/// # Safety
/// `src.len() == dst.len()`.
pub unsafe fn f16_to_f32(src: &[f16], dst: &mut [f32]) {
    assert_eq!(src.len(), dst.len());
    let n = src.len();
    let (sp, dp) = (src.as_ptr(), dst.as_mut_ptr());
    let mut i = 0;
    // SAFETY: i + 8 <= n for both slices.
    unsafe {
        while i + 8 <= n {
            let h = v128_load(sp.add(i) as *const v128);
            v128_store(
                dp.add(i) as *mut v128,
                f16_bits_to_f32(u32x4_extend_low_u16x8(h)),
            );
            v128_store(
                dp.add(i + 4) as *mut v128,
                f16_bits_to_f32(u32x4_extend_high_u16x8(h)),
            );
            i += 8;
        }
    }
    for j in i..n {
        dst[j] = src[j].to_f32();
    }
}
