//! The state digest: equal digests mean equal tokens and equal KV pages, so two runs (or a
//! save and a restore) can be compared without comparing caches.
//!
//! Bytes hashed (blake3), unchanged since the digest was introduced: every token of the
//! session (by position, retired ones included) as u32 little endian, then the cache's
//! canonical snapshot (`KvCache::export_snapshot`: pages as stored).

use spinkv_kv::{Digest, KvCache};
use spinkv_model::Session;

pub fn state_digest(session: &Session) -> Digest {
    state_digest_of(session.tokens(), session.cache())
}

/// The digest of `tokens` and `cache` (the state of a session, or of a session file).
pub fn state_digest_of(tokens: &[u32], cache: &KvCache) -> Digest {
    let mut bytes: Vec<u8> = tokens.iter().flat_map(|t| t.to_le_bytes()).collect();
    cache.export_snapshot(&mut bytes);
    spinkv_session::digest(&bytes)
}
