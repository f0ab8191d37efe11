//! Fixtures shared by the unit tests (`src/file.rs`) and the loader fuzz test: the small
//! cache shape, seeded test values and an identity with fixed hashes. Each includer brings
//! `context_digest` into scope first (the crate's own, or `spinkv_session::context_digest`).

use super::context_digest;
use spinkv_kv::{CacheIdentity, IdentityInputs, KvCache, KvConfig, KvShape};

pub(crate) const SHAPE: KvShape = KvShape {
    n_layers: 2,
    n_heads: 4,
    n_kv_heads: 2,
    head_dim: 16,
};

/// `n` values uniform in [-1, 1) from a xorshift stream seeded by `seed`.
pub(crate) fn values(seed: u64, n: usize) -> Vec<f32> {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 40) as f32 / (1u64 << 23) as f32 - 1.0
        })
        .collect()
}

/// The identity of `tokens` in `cache` under `config`, with fixed model, tokenizer and
/// template hashes.
pub(crate) fn identity(
    config: &KvConfig,
    tokens: &[u32],
    cache: &KvCache,
    runtime_build: String,
) -> CacheIdentity {
    CacheIdentity::new(
        &SHAPE,
        config,
        IdentityInputs {
            model_hash: [1; 32],
            tokenizer_hash: [2; 32],
            chat_template_hash: [3; 32],
            context_tokens: tokens.len() as u64,
            context_digest: context_digest(tokens, cache.retired(), cache.gap()),
            runtime_build,
        },
    )
}
