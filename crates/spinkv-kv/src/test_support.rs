//! Helpers shared by the crate's unit tests.

use crate::config::KvShape;
use crate::rng::SplitMix64;

pub(crate) fn normals(rng: &mut SplitMix64, n: usize, scale: f64) -> Vec<f32> {
    (0..n).map(|_| (rng.normal() * scale) as f32).collect()
}

/// Naive causal GQA attention in f64, the one the integration tests use too.
#[path = "../tests/common/reference.rs"]
mod reference;
pub(crate) use reference::reference_attention;
