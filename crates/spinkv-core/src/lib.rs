//! spinkv-core: the contracts of spinkv in one API, for every face. The Python binding
//! (spinkv-py) and the browser build call this and only convert types; nothing a user can
//! observe is decided above it.
//!
//! - cache options: [`KvOptions`] → [`KvConfig::from_options`], the one [`DEFAULT_PRESET`],
//!   [`PRESETS`], [`OPTION_KEYS`] (defined in spinkv-kv, next to the config they build);
//! - sessions: the identity of a session's cache ([`identity`]), session files (`persist`:
//!   save, read, verify, restore into a session only after every check), the state digest
//!   ([`state_digest`]) and prefix reuse ([`prefix`]);
//! - model inspection: [`inspect_model`] (the loader's own file rule, config parser and list
//!   of the tensors it needs, checked against the safetensors headers alone);
//! - the prefill block, [`PREFILL_BLOCK_TOKENS`], and the cache accounting invariants,
//!   [`CacheStats::accounting_problems`];
//! - the kernel benchmark on a chosen ISA ([`kernel_bench`]);
//! - a model held in memory (the browser build): its content hash from bytes ([`in_memory`]).
//!
//! File IO sits behind the default `fs` feature; without it the core works on bytes.

mod error;
pub mod identity;
pub mod in_memory;
mod kernel_bench;
#[cfg(feature = "fs")]
mod model_hash;
pub mod persist;
pub mod prefix;
mod state_digest;

pub use error::{InvalidInput, SessionError};
pub use identity::{session_identity, IdentityHashes};
pub use kernel_bench::kernel_bench;
#[cfg(feature = "fs")]
pub use model_hash::ModelHashCell;
pub use state_digest::{state_digest, state_digest_of};

pub use spinkv_kv::identity::{hex, parse_hex_digest};
pub use spinkv_kv::{
    CacheIdentity, CacheStats, Digest, KvCodecKind, KvConfig, KvError, KvOptions, LayerStats,
    ModelKvDefaults, NormFormat, OptionKind, OptionValue, PhaseTimes, DEFAULT_PRESET, OPTION_KEYS,
    PRESETS,
};
pub use spinkv_model::{
    inspect as inspect_model, set_threads, threads, LlamaConfig, Model, ModelError,
    ModelInspection, Sampler, SamplerParams, Session, WeightBytes, WeightFile, MAX_THREADS,
    PREFILL_BLOCK_TOKENS,
};
#[cfg(not(target_arch = "wasm32"))]
pub use spinkv_model::{read_bandwidth, ReadBandwidth};
#[cfg(target_arch = "wasm32")]
pub use spinkv_model::{set_host_hooks, HostHooks};
pub use spinkv_session::{
    runtime_build, SessionFileError, SessionHeader, FORMAT_VERSION, MAGIC as SESSION_MAGIC,
};
