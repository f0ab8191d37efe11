//! spinkv in a wasm32+simd128 module, for node and browsers.
//!
//! - The runtime (`engine`, feature `runtime`): a model loaded from bytes the host hands over (safetensors,
//!   config.json, tokenizer.json, the chat template), sessions with every KV preset, chat turns
//!   streamed token by token, cache and memory accounting, session files in the native format
//!   with the same identity record, and a decode benchmark. Called through `abi`: the host
//!   writes a JSON request and reads a JSON (or byte) reply; large inputs (weights, session
//!   files) go into buffers the host fills in place.
//! - The kernel checks (`kernels`): `parity() -> u32` (failed checks) and `bench()`.
//!
//! The host provides `env.log(ptr, len)`, `env.now()` (ms) and `env.random_u32()` (see
//! `cli/spinkv/web/static/spinkv.js` and `run.mjs`). Built with `-C target-feature=+simd128`
//! (`spinkv.web.bundle`), so `Isa::Simd128` runs beside `Scalar`. One thread: no atomics, no
//! shared memory.
//!
//! `window` (which messages a sliding chat feeds) is pure and compiled on every target, so its
//! unit tests run natively; everything else is wasm32 only.

#[cfg(all(target_arch = "wasm32", feature = "runtime"))]
mod abi;
#[cfg(all(target_arch = "wasm32", feature = "runtime"))]
mod engine;
#[cfg(target_arch = "wasm32")]
mod host;
#[cfg(target_arch = "wasm32")]
mod kernels;
#[cfg(all(target_arch = "wasm32", feature = "runtime"))]
mod template;
pub mod window;
