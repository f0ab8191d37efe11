//! WASM SIMD128 snapping, 4 channels at a time: count thresholds below each lane (compare +
//! subtract the all-ones mask); levels by table lookup of the counts.

use super::Codebooks;
use core::arch::wasm32::*;

/// # Safety
/// Shapes as checked by `super::quantize`.
pub unsafe fn quantize(books: Codebooks<'_>, y: &[f32], codes: &mut [u8], recon: &mut [f32]) {
    for (first, len, t, l, _) in books.runs() {
        let mut c = first;
        while c < first + len {
            let n = (first + len - c).min(4);
            let mut four = [0.0f32; 4];
            four[..n].copy_from_slice(&y[c..c + n]);
            // SAFETY: load of a local array.
            let x = unsafe { v128_load(four.as_ptr() as *const v128) };
            let mut count = u32x4_splat(0);
            for &th in t {
                count = i32x4_sub(count, f32x4_lt(f32x4_splat(th), x));
            }
            let counts = [
                u32x4_extract_lane::<0>(count),
                u32x4_extract_lane::<1>(count),
                u32x4_extract_lane::<2>(count),
                u32x4_extract_lane::<3>(count),
            ];
            for k in 0..n {
                codes[c + k] = counts[k] as u8;
                recon[c + k] = l[counts[k] as usize];
            }
            c += 4;
        }
    }
}
