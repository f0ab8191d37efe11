//! Reference Q8_0 × 16-bit dot products: the canonical arithmetic of the module docs, written
//! out.

use super::{lane_elements, Tile, PARTIALS};
use crate::canon;
use crate::weight::Q8_BLOCK;

pub fn dot_tile(tile: Tile<'_>, y: &mut [f32]) {
    tile.for_each_output(y, |codes, scales, x_codes, x_scales| {
        let mut lanes = [0.0f32; canon::LANES];
        for (b, (&w_scale, &x_scale)) in scales.iter().zip(x_scales).enumerate() {
            let scale = w_scale.to_f32() * x_scale;
            let half = &mut lanes[(b % 2) * PARTIALS..][..PARTIALS];
            for (l, lane) in half.iter_mut().enumerate() {
                let partial: i32 = lane_elements(l)
                    .iter()
                    .map(|&j| codes[b * Q8_BLOCK + j] as i32 * x_codes[b * Q8_BLOCK + j] as i32)
                    .sum();
                *lane = canon::fma(scale, partial as f32, *lane);
            }
        }
        canon::reduce16(&lanes)
    })
}
