//! spinkv-model: the Llama-family runtime — config, memory-mapped safetensors weights (or bytes
//! a host hands over: `Model::from_bytes`), batched prefill and single-token decode over a
//! spinkv-kv cache, and the sampler. `platform` holds what differs on wasm32.

#[cfg(not(target_arch = "wasm32"))]
mod bandwidth;
mod config;
mod error;
mod forward;
mod inspect;
mod model;
mod parallel;
mod platform;
mod sampler;
mod session;
mod timings;
mod weights;

#[cfg(not(target_arch = "wasm32"))]
pub use bandwidth::{read_bandwidth, ReadBandwidth, PROBE_MIB_RANGE, PROBE_PASSES_RANGE};
pub use config::LlamaConfig;
pub use error::ModelError;
pub use inspect::{inspect, ModelInspection, WeightFile};
pub use model::Model;
pub use parallel::{set_threads, threads, MAX_THREADS};
#[cfg(target_arch = "wasm32")]
pub use platform::{set_host_hooks, HostHooks};
pub use sampler::{Sampler, SamplerParams};
pub use session::{Session, PREFILL_BLOCK_TOKENS};
pub use timings::PhaseTimings;
pub use weights::WeightBytes;

pub use spinkv_kernels::WeightDtype;
pub use spinkv_kv::{CacheStats, KvConfig, KvShape};

#[cfg(test)]
mod tests;
