//! Helpers shared by the crate's unit tests.

use crate::config::KvShape;
use crate::rng::SplitMix64;

pub(crate) fn normals(rng: &mut SplitMix64, n: usize, scale: f64) -> Vec<f32> {
    (0..n).map(|_| (rng.normal() * scale) as f32).collect()
}

/// How far attention from a cache with `config` may land from exact attention over its decoded
/// keys and values. Turbo's values are accumulated on an integer grid (spinkv-kernels'
/// `kv_accumulate::grid`): each level within 1/254 of the largest, each weight within 1/254 of
/// its 32-token chunk's largest; its keys are scored against a 7-bit query (each coordinate
/// within 1/126 of the largest: `kv_score::int_dot`). On these small unit-normal caches that
/// moved outputs by up to 0.060 (the value grid alone by ~0.02); a scan that read a wrong code
/// or channel moves them by ~1.
pub(crate) fn attention_tolerance(config: &crate::config::KvConfig) -> f32 {
    match config.codec {
        crate::config::KvCodecKind::Turbo | crate::config::KvCodecKind::TurboQjl => 0.1,
        _ => 1e-4,
    }
}

/// Naive causal GQA attention in f64, the one the integration tests use too.
#[path = "../tests/common/reference.rs"]
mod reference;
pub(crate) use reference::reference_attention;
