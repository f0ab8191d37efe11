//! Reference snapping: a binary search over each channel's sorted thresholds.

use crate::codes::{CodeLayout, Levels};

pub fn quantize(
    y: &[f32],
    layout: &CodeLayout,
    thresholds: Levels<'_>,
    levels: Levels<'_>,
    codes: &mut [u8],
    recon: &mut [f32],
) {
    for (first, len, t, l, _) in super::runs(layout, thresholds, levels) {
        for c in first..first + len {
            let code = t.partition_point(|&t| t < y[c]);
            codes[c] = code as u8;
            recon[c] = l[code];
        }
    }
}
