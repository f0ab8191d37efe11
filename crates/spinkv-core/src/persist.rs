//! Session files: a session saved with its transcript, read back for a listing, verified, and
//! restored into a session only after every check passed (file, identity, every page), so a
//! failed restore leaves the session untouched. The format and its checks are
//! spinkv-session's; this module joins them to a model's sessions.
//!
//! The byte-level functions serve every build; the path-level ones (feature `fs`) add the file
//! IO: the file is written in place and synced to disk (atomic replacement and locking are the
//! caller's, who knows the store's layout).

use spinkv_kv::Digest;
use spinkv_model::Session;
use spinkv_session::{SessionFileError, SessionHeader};

use crate::error::SessionError;
use crate::identity::{session_identity, IdentityHashes};

/// The complete session file for `session` with `transcript` (JSON text the caller owns).
pub fn session_file_bytes(
    session: &Session,
    model_hash: Digest,
    hashes: &IdentityHashes,
    transcript: &str,
) -> Vec<u8> {
    let identity = session_identity(session, model_hash, hashes);
    spinkv_session::save_bytes(&identity, transcript, session.tokens(), session.cache())
}

/// Restores the session file `bytes` into `session` and returns its transcript. `origin`
/// names the file in errors ("session file /path"). The identity expected is `session`'s own
/// (with `model_hash` and `hashes`): a cache made under any other model, tokenizer, template,
/// codec or layout is refused, naming the fields that differ.
pub fn restore_session_bytes(
    session: &mut Session,
    model_hash: Digest,
    hashes: &IdentityHashes,
    bytes: &[u8],
    origin: &str,
) -> Result<String, SessionError> {
    let expected = session_identity(session, model_hash, hashes);
    let (header, state) = spinkv_session::restore(bytes, &expected, session.cache().config())
        .map_err(|e| SessionError::file(origin, e))?;
    session
        .restore(state.tokens, state.cache)
        .map_err(|source| SessionError::Restore {
            origin: origin.to_string(),
            source,
        })?;
    Ok(header.transcript)
}

/// Header (identity, transcript, sizes) of the session file `bytes`, and with `verify` whether
/// the whole-file digest holds (the pages are intact).
pub fn read_session_bytes(
    bytes: &[u8],
    verify: bool,
    origin: &str,
) -> Result<(SessionHeader, Option<bool>), SessionError> {
    let header =
        spinkv_session::parse_header_bytes(bytes).map_err(|e| SessionError::file(origin, e))?;
    let intact = verify.then(|| spinkv_session::file_digest_holds(bytes));
    Ok((header, intact))
}

/// Whether `err` leaves the file's transcript readable (only its KV cache is refused).
pub fn transcript_survives(err: &SessionError) -> bool {
    match err {
        SessionError::File { source, .. } => source.transcript_intact(),
        SessionError::Restore { .. } => true,
        SessionError::ModelHash(_) | SessionError::Write(_) => false,
    }
}

/// The identity fields that differ when `err` is an identity mismatch.
pub fn mismatched_fields(err: &SessionError) -> Option<&[&'static str]> {
    match err {
        SessionError::File {
            source: SessionFileError::IdentityMismatch(fields),
            ..
        } => Some(fields),
        _ => None,
    }
}

#[cfg(feature = "fs")]
pub use on_disk::*;

#[cfg(feature = "fs")]
mod on_disk {
    use std::fs::File;
    use std::io::Write;
    use std::path::Path;

    use spinkv_kv::CacheIdentity;
    use spinkv_model::Session;
    use spinkv_session::{SessionFileError, SessionHeader};

    use super::{restore_session_bytes, session_file_bytes};
    use crate::error::SessionError;
    use crate::identity::{session_identity, IdentityHashes};
    use crate::model_hash::ModelHashCell;

    fn origin(path: &Path) -> String {
        format!("session file {}", path.display())
    }

    /// The identity of `session`'s cache now (the model hash from `model_hash`, computed on
    /// first use).
    pub fn current_identity(
        session: &Session,
        model_hash: &ModelHashCell,
        hashes: &IdentityHashes,
    ) -> Result<CacheIdentity, SessionError> {
        let digest = model_hash.labelled(session.model().dir())?;
        Ok(session_identity(session, digest, hashes))
    }

    /// Writes `session` with `transcript` to `path` (created or replaced, synced to disk) and
    /// returns the bytes written.
    pub fn save_session(
        session: &Session,
        model_hash: &ModelHashCell,
        hashes: &IdentityHashes,
        transcript: &str,
        path: &Path,
    ) -> Result<usize, SessionError> {
        let digest = model_hash.labelled(session.model().dir())?;
        let bytes = session_file_bytes(session, digest, hashes, transcript);
        let mut file = File::create(path)?;
        file.write_all(&bytes)?;
        // A session file is what survives a crash of the chat; it must not be a page-cache
        // promise.
        file.sync_all()?;
        Ok(bytes.len())
    }

    /// Restores the session file at `path` into `session` and returns its transcript; see
    /// [`restore_session_bytes`]. The model hash is recomputed from the weights' bytes.
    pub fn load_session(
        session: &mut Session,
        model_hash: &ModelHashCell,
        hashes: &IdentityHashes,
        path: &Path,
    ) -> Result<String, SessionError> {
        let digest = model_hash.verified(session.model().dir())?;
        let file_error = |e: SessionFileError| SessionError::file(&origin(path), e);
        if path.is_dir() {
            return Err(file_error(SessionFileError::Directory));
        }
        let bytes = std::fs::read(path).map_err(|e| file_error(e.into()))?;
        restore_session_bytes(session, digest, hashes, &bytes, &origin(path))
    }

    /// Header of the session file at `path` (its pages are not read), and with `verify`
    /// whether the whole-file digest holds.
    pub fn read_session(
        path: &Path,
        verify: bool,
    ) -> Result<(SessionHeader, Option<bool>), SessionError> {
        let file_error = |e: SessionFileError| SessionError::file(&origin(path), e);
        let header = spinkv_session::read_header(path).map_err(file_error)?;
        let intact = match verify {
            true => Some(spinkv_session::file_is_intact(path).map_err(file_error)?),
            false => None,
        };
        Ok((header, intact))
    }
}
