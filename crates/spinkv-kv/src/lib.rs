//! spinkv-kv: the paged, quantized KV cache.
//!
//! Layers of this crate, each using only the ones below it:
//! `cache` (public `KvCache`: validation, lifecycle) → `table` (per-layer page tables) and
//! `attend` (streaming attention over pages) → `codec` (page formats, attention from codes) →
//! `page` (header format) and `pool` (page bookkeeping, in slabs from `huge_pages`) → `kernels`
//! (f32/f16 loops).
//! Beside the cache manager: `lifecycle` (checkpoint/rollback, page retirement, reservation),
//! `snapshot` (pages out and back in, validated), `identity` (what must match for reuse) and
//! `options` (presets and overrides as front ends pass them).

mod attend;
mod cache;
mod codebook;
mod codec;
mod config;
mod error;
pub mod huge_pages;
pub mod identity;
mod kernels;
mod lifecycle;
mod options;
mod pack;
pub mod page;
mod pool;
mod profile;
mod rng;
pub mod snapshot;
mod stats;
mod table;
#[cfg(test)]
mod test_support;
mod transform;
mod window;
pub mod wire;

pub use cache::{sealed_bits_per_channel, KvCache};
pub use codebook::CODEBOOK_VERSION;
pub use config::{
    KvCodecKind, KvConfig, KvShape, NormFormat, DEFAULT_MAX_TOKENS, DEFAULT_PAGE_TOKENS,
    DEFAULT_PRESET, DEFAULT_SEED, DEFAULT_WINDOW, PRESETS, TURBO_SINK_TOKENS, TURBO_WINDOW,
};
pub use error::KvError;
pub use identity::{
    parse_hex_digest, CacheIdentity, Digest, HexError, IdentityInputs, CACHE_FORMAT_VERSION,
};
pub use options::{KvOptions, ModelKvDefaults, OptionKind, OptionValue, OPTION_KEYS};
pub use page::PageError;
pub use profile::PhaseTimes;
pub use snapshot::SnapshotError;
pub use stats::{CacheStats, LayerStats};
