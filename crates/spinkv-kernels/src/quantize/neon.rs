//! NEON snapping, 4 channels at a time: count thresholds below each lane (compare + subtract
//! the all-ones mask); levels by table lookup of the counts.

use super::Codebooks;
use core::arch::aarch64::*;

/// # Safety
/// aarch64; shapes as checked by `super::quantize`.
pub unsafe fn quantize(books: Codebooks<'_>, y: &[f32], codes: &mut [u8], recon: &mut [f32]) {
    for (first, len, t, l, _) in books.runs() {
        let mut c = first;
        while c < first + len {
            let n = (first + len - c).min(4);
            let mut four = [0.0f32; 4];
            four[..n].copy_from_slice(&y[c..c + n]);
            let mut counts = [0u32; 4];
            // SAFETY: loads and stores of local arrays.
            unsafe {
                let x = vld1q_f32(four.as_ptr());
                let mut count = vdupq_n_u32(0);
                for &th in t {
                    count = vsubq_u32(count, vcltq_f32(vdupq_n_f32(th), x));
                }
                vst1q_u32(counts.as_mut_ptr(), count);
            }
            for k in 0..n {
                codes[c + k] = counts[k] as u8;
                recon[c + k] = l[counts[k] as usize];
            }
            c += 4;
        }
    }
}
