//! NEON / SIMD128 Q8_0 × 16-bit dot products: the eight integer partial sums of a block in
//! plain Rust (exact, vectorised by the compiler), then four 4-lane accumulators — even blocks
//! in quads 0–1, odd blocks in 2–3 — and the canonical reduction (`canon::reduce16` on the
//! stored lanes: SIMD128 has no vector version of it).

use super::{lane_elements, Tile, PARTIALS};
use crate::simd::quad;
use crate::weight::Q8_BLOCK;

/// # Safety
/// NEON or SIMD128 (whichever this build has); `tile` checked against `y`.
pub unsafe fn dot_tile(tile: Tile<'_>, y: &mut [f32]) {
    tile.for_each_output(y, |codes, scales, x_codes, x_scales| {
        let mut acc = [quad::splat(0.0); 4];
        for (b, (&w_scale, &x_scale)) in scales.iter().zip(x_scales).enumerate() {
            let block = b * Q8_BLOCK..(b + 1) * Q8_BLOCK;
            let (wb, xb) = (&codes[block.clone()], &x_codes[block]);
            let mut partials = [0.0f32; PARTIALS];
            for (l, partial) in partials.iter_mut().enumerate() {
                let sum: i32 = lane_elements(l)
                    .iter()
                    .map(|&j| wb[j] as i32 * xb[j] as i32)
                    .sum();
                *partial = sum as f32;
            }
            let scale = quad::splat(w_scale.to_f32() * x_scale);
            let half = (b % 2) * 2;
            // SAFETY: `partials` holds 8 floats: two loads of 4.
            unsafe {
                acc[half] = quad::mul_add(scale, quad::load(partials.as_ptr()), acc[half]);
                acc[half + 1] =
                    quad::mul_add(scale, quad::load(partials.as_ptr().add(4)), acc[half + 1]);
            }
        }
        let mut lanes = [0.0f32; crate::canon::LANES];
        for (i, &q) in acc.iter().enumerate() {
            // SAFETY: `lanes` holds 16 floats: four stores of 4.
            unsafe { quad::store(lanes.as_mut_ptr().add(4 * i), q) };
        }
        crate::canon::reduce16(&lanes)
    })
}
