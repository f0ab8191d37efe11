//! NEON / SIMD128 snapping, one loop for both 4-lane ISAs, 4 channels at a time: count the
//! thresholds below each lane (compare + subtract the all-ones mask); levels by table lookup
//! of the counts.

use super::Codebooks;

/// # Safety
/// NEON or SIMD128 (whichever this build has); shapes as checked by `super::quantize`.
pub unsafe fn quantize(books: Codebooks<'_>, y: &[f32], codes: &mut [u8], recon: &mut [f32]) {
    for (first, len, t, l, _) in books.runs() {
        let mut c = first;
        while c < first + len {
            let n = (first + len - c).min(4);
            let mut four = [0.0f32; 4];
            four[..n].copy_from_slice(&y[c..c + n]);
            let counts = counts_below(t, &four);
            for k in 0..n {
                codes[c + k] = counts[k] as u8;
                recon[c + k] = l[counts[k] as usize];
            }
            c += 4;
        }
    }
}

/// For each of the 4 lanes of `x`: how many of `thresholds` lie below it.
#[cfg(target_arch = "aarch64")]
#[inline(always)]
fn counts_below(thresholds: &[f32], x: &[f32; 4]) -> [u32; 4] {
    use core::arch::aarch64::*;
    let mut counts = [0u32; 4];
    // SAFETY: NEON is baseline on aarch64; loads and stores of local arrays.
    unsafe {
        let x = vld1q_f32(x.as_ptr());
        let mut count = vdupq_n_u32(0);
        for &th in thresholds {
            count = vsubq_u32(count, vcltq_f32(vdupq_n_f32(th), x));
        }
        vst1q_u32(counts.as_mut_ptr(), count);
    }
    counts
}

/// For each of the 4 lanes of `x`: how many of `thresholds` lie below it.
#[cfg(target_arch = "wasm32")]
#[inline(always)]
fn counts_below(thresholds: &[f32], x: &[f32; 4]) -> [u32; 4] {
    use core::arch::wasm32::*;
    // SAFETY: load of a local array (simd128 is a compile-time feature of this build).
    let x = unsafe { v128_load(x.as_ptr() as *const v128) };
    let mut count = u32x4_splat(0);
    for &th in thresholds {
        count = i32x4_sub(count, f32x4_lt(f32x4_splat(th), x));
    }
    [
        u32x4_extract_lane::<0>(count),
        u32x4_extract_lane::<1>(count),
        u32x4_extract_lane::<2>(count),
        u32x4_extract_lane::<3>(count),
    ]
}
