//! spinkv-model: the Llama-family runtime — config, memory-mapped safetensors weights,
//! batched prefill and single-token decode over a spinkv-kv cache, and the sampler.

mod config;
mod error;
mod forward;
mod inspect;
mod model;
mod parallel;
mod sampler;
mod session;
mod timings;
mod weights;

pub use config::LlamaConfig;
pub use error::ModelError;
pub use inspect::{inspect, ModelInspection, WeightFile};
pub use model::Model;
pub use parallel::{set_threads, threads, MAX_THREADS};
pub use sampler::{Sampler, SamplerParams};
pub use session::{Session, PREFILL_BLOCK_TOKENS};
pub use timings::PhaseTimings;

pub use spinkv_kernels::WeightDtype;
pub use spinkv_kv::{CacheStats, KvConfig, KvShape};

#[cfg(test)]
mod tests;
