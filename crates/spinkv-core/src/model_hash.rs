//! A loaded model's content hash, computed at most once and shared by its sessions: every
//! identity record carries it, and hashing gigabytes per save would be absurd.

use std::path::Path;
use std::sync::OnceLock;

use spinkv_kv::Digest;

use crate::error::SessionError;

#[derive(Debug, Default)]
pub struct ModelHashCell {
    // The error is kept as text: a model whose files cannot be hashed is reported the same
    // way on every save rather than re-hashed.
    digest: OnceLock<Result<Digest, String>>,
}

fn hash_error(dir: &Path, err: std::io::Error) -> SessionError {
    SessionError::ModelHash(format!("cannot hash the model in {}: {err}", dir.display()))
}

impl ModelHashCell {
    pub fn new() -> Self {
        Self::default()
    }

    /// The hash of the model in `dir`, computed on first use (cached on disk by size and
    /// mtime): enough to label a cache being saved.
    pub fn labelled(&self, dir: &Path) -> Result<Digest, SessionError> {
        self.digest
            .get_or_init(|| {
                spinkv_session::model_hash(dir)
                    .map(|h| h.digest)
                    .map_err(|e| hash_error(dir, e).to_string())
            })
            .clone()
            .map_err(SessionError::ModelHash)
    }

    /// The hash computed from the weights' bytes, for restoring pages: a hash cached by size
    /// and mtime could let pages run on other weights. Seeds the cell when it is empty, so
    /// later saves carry the verified hash.
    pub fn verified(&self, dir: &Path) -> Result<Digest, SessionError> {
        let digest = spinkv_session::model_hash_verified(dir)
            .map(|h| h.digest)
            .map_err(|e| hash_error(dir, e))?;
        let _ = self.digest.set(Ok(digest));
        Ok(digest)
    }
}
