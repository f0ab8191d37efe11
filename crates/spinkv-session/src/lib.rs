//! spinkv-session: conversations saved with their KV pages, and the cache identity around them.
//!
//! - `file`: the `.spkv` session file (magic, version, identity record, transcript, tokens and
//!   KV pages, checksums) with a parser that never panics.
//! - `model_hash`: a content hash of a model's weights and config, cached by size and mtime
//!   (feature `fs`).
//! - [`runtime_build`] and [`context_digest`]: the remaining identity inputs.
//!
//! It depends on spinkv-kv only; spinkv-core joins it to a model's sessions. Without the
//! default `fs` feature it works on bytes only and builds for wasm32-unknown-unknown.

pub mod file;
#[cfg(feature = "fs")]
pub mod model_hash;

pub use file::{
    file_digest_holds, parse_header_bytes, restore, save_bytes, SessionFileError, SessionHeader,
    SessionState, FORMAT_VERSION, MAGIC,
};
#[cfg(feature = "fs")]
pub use file::{file_is_intact, read_header};
#[cfg(feature = "fs")]
pub use model_hash::{model_hash, model_hash_verified, ModelHash};

use spinkv_kv::Digest;

/// The runtime that writes a cache: crate version and source commit ("unknown" when the build
/// had no git).
pub fn runtime_build() -> String {
    format!(
        "spinkv {}+{}",
        env!("CARGO_PKG_VERSION"),
        env!("SPINKV_GIT_COMMIT")
    )
}

/// Digest of what a cache holds: every token fed (by position) and where tokens were retired.
pub fn context_digest(tokens: &[u32], retired: usize, gap: usize) -> Digest {
    let mut hasher = blake3::Hasher::new();
    hasher.update(b"spinkv context v1");
    hasher.update(&(retired as u64).to_le_bytes());
    hasher.update(&(gap as u64).to_le_bytes());
    hasher.update(&(tokens.len() as u64).to_le_bytes());
    for token in tokens {
        hasher.update(&token.to_le_bytes());
    }
    *hasher.finalize().as_bytes()
}

/// blake3 of `bytes`.
pub fn digest(bytes: &[u8]) -> Digest {
    *blake3::hash(bytes).as_bytes()
}
