//! Reference Q8_0 × Q8_0 dot products: the canonical arithmetic of the module docs, written out.

use super::{lane_elements, Tile, PARTIALS};
use crate::canon;
use crate::weight::Q8_BLOCK;

pub fn dot_tile(tile: Tile<'_>, y: &mut [f32]) {
    let k = tile.k;
    let blocks = k / Q8_BLOCK;
    for t in tile.tokens.clone() {
        let (x_codes, x_scales) = tile.x.token(t, k);
        for r in tile.rows.clone() {
            let codes = &tile.w.codes[r * k..(r + 1) * k];
            let scales = &tile.w.scales[r * blocks..(r + 1) * blocks];
            let mut lanes = [0.0f32; canon::LANES];
            for b in 0..blocks {
                let scale = scales[b].to_f32() * x_scales[b];
                let half = &mut lanes[(b % 2) * PARTIALS..][..PARTIALS];
                for (l, lane) in half.iter_mut().enumerate() {
                    let partial: i32 = lane_elements(l)
                        .iter()
                        .map(|&j| codes[b * Q8_BLOCK + j] as i32 * x_codes[b * Q8_BLOCK + j] as i32)
                        .sum();
                    *lane = canon::fma(scale, partial as f32, *lane);
                }
            }
            y[t * tile.y_stride + (r - tile.rows.start)] = canon::reduce16(&lanes);
        }
    }
}
