//! NEON bulk conversions (FCVTN / FCVTL), 4 lanes per instruction.

use crate::simd::neon::{f16x4_to_f32, f32_to_f16x4};
use core::arch::aarch64::*;
use half::f16;

/// # Safety
/// aarch64; `src.len() == dst.len()`.
pub unsafe fn f32_to_f16(src: &[f32], dst: &mut [f16]) {
    assert_eq!(src.len(), dst.len());
    let n = src.len();
    let (sp, dp) = (src.as_ptr(), dst.as_mut_ptr() as *mut u16);
    let mut i = 0;
    // SAFETY: i + 4 <= n for both slices.
    unsafe {
        while i + 4 <= n {
            vst1_u16(dp.add(i), f32_to_f16x4(vld1q_f32(sp.add(i))));
            i += 4;
        }
    }
    for j in i..n {
        dst[j] = f16::from_f32(src[j]);
    }
}

/// # Safety
/// aarch64; `src.len() == dst.len()`.
pub unsafe fn f16_to_f32(src: &[f16], dst: &mut [f32]) {
    assert_eq!(src.len(), dst.len());
    let n = src.len();
    let (sp, dp) = (src.as_ptr() as *const u16, dst.as_mut_ptr());
    let mut i = 0;
    // SAFETY: i + 4 <= n for both slices.
    unsafe {
        while i + 4 <= n {
            vst1q_f32(dp.add(i), f16x4_to_f32(vld1_u16(sp.add(i))));
            i += 4;
        }
    }
    for j in i..n {
        dst[j] = src[j].to_f32();
    }
}
