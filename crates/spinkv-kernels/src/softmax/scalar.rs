//! Reference softmax pieces, in the canonical operation order.

pub fn max_f32(x: &[f32]) -> f32 {
    x.iter().copied().fold(f32::NEG_INFINITY, f32::max)
}

/// Canonical softmax exp and canonical 16-lane sum (see `crate::canon`).
pub fn exp_sub_sum(x: &mut [f32], m: f32) -> f32 {
    for v in x.iter_mut() {
        *v = crate::canon::exp_softmax(*v - m);
    }
    crate::canon::sum(x)
}

/// The blocks under the cap, then one canonical pass over them.
pub fn exp_sub_sum_capped(x: &mut [f32], m: f32, cap: f32) -> (usize, f32) {
    let done = super::capped_prefix(x, cap, max_f32);
    (done, exp_sub_sum(&mut x[..done], m))
}

/// Block by block, row by row.
pub fn blocks_reaching(
    x: &[f32],
    stride: usize,
    block: usize,
    blocks: usize,
    limits: &[f32],
) -> u64 {
    let mut found = 0u64;
    for b in 0..blocks {
        let reached = limits.iter().enumerate().any(|(r, &limit)| {
            x[r * stride + b * block..][..block]
                .iter()
                .any(|&w| w >= limit)
        });
        found |= u64::from(reached) << b;
    }
    found
}
