//! Sessions on disk: the identity of a session's cache, saving it with its transcript, and
//! restoring it into a session only after every check passed. File formats and checks live in
//! spinkv-session; this file converts arguments and errors.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use pyo3::prelude::*;
use pyo3::types::PyDict;
use spinkv_kv::{CacheIdentity, Digest, IdentityInputs, KvCache};
use spinkv_model::Session;
use spinkv_session::{context_digest, runtime_build, SessionFileError, SessionHeader};

use crate::errors::{guarded, identity_mismatch, invalid_input, new_error, Kind};

/// A model's content hash, computed at most once per loaded model (shared with its sessions).
pub type ModelHashCell = Arc<OnceLock<Result<Digest, String>>>;

fn hash_error(dir: &Path, err: std::io::Error) -> String {
    format!("cannot hash the model in {}: {err}", dir.display())
}

/// The model hash, computing it on first use (cached on disk by size + mtime): the label of
/// a cache being saved.
pub fn model_hash(cell: &ModelHashCell, dir: &Path) -> PyResult<Digest> {
    cell.get_or_init(|| {
        spinkv_session::model_hash(dir)
            .map(|h| h.digest)
            .map_err(|e| hash_error(dir, e))
    })
    .clone()
    .map_err(|message| new_error(Kind::SessionFile, message))
}

/// The model hash computed from the weights' bytes, for restoring pages: a cached hash keyed
/// by size and mtime could let pages run on other weights. Also seeds `cell` when it is empty,
/// so later saves carry the verified hash.
pub fn verified_model_hash(cell: &ModelHashCell, dir: &Path) -> PyResult<Digest> {
    let digest = spinkv_session::model_hash_verified(dir)
        .map(|h| h.digest)
        .map_err(|e| new_error(Kind::SessionFile, hash_error(dir, e)))?;
    let _ = cell.set(Ok(digest));
    Ok(digest)
}

/// Values of the identity the caller knows: `tokenizer_hash`, `chat_template_hash` (hex).
pub struct IdentityExtra {
    tokenizer_hash: Digest,
    chat_template_hash: Digest,
}

fn parse_digest(name: &str, value: &Bound<'_, PyAny>) -> PyResult<Digest> {
    let text: String = value
        .extract()
        .map_err(|_| invalid_input(format!("{name} must be a hex string")))?;
    let mut out = [0u8; 32];
    let bytes = text.as_bytes();
    if bytes.len() != 64 {
        return Err(invalid_input(format!(
            "{name} must be 64 hex digits, got {}",
            bytes.len()
        )));
    }
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = std::str::from_utf8(&bytes[2 * i..2 * i + 2])
            .ok()
            .and_then(|pair| u8::from_str_radix(pair, 16).ok())
            .ok_or_else(|| invalid_input(format!("{name} is not hex: {text:?}")))?;
    }
    Ok(out)
}

impl IdentityExtra {
    pub fn from_dict(extra: Option<&Bound<'_, PyDict>>) -> PyResult<Self> {
        let mut out = IdentityExtra {
            tokenizer_hash: [0; 32],
            chat_template_hash: [0; 32],
        };
        let Some(extra) = extra else {
            return Ok(out);
        };
        for (key, value) in extra.iter() {
            let key: String = key.extract()?;
            match key.as_str() {
                "tokenizer_hash" => out.tokenizer_hash = parse_digest(&key, &value)?,
                "chat_template_hash" => out.chat_template_hash = parse_digest(&key, &value)?,
                other => {
                    return Err(invalid_input(format!(
                        "unknown identity field {other:?} (expected tokenizer_hash, chat_template_hash)"
                    )))
                }
            }
        }
        Ok(out)
    }
}

/// The identity of `session`'s cache as it is now.
pub fn identity_of(session: &Session, model_hash: Digest, extra: &IdentityExtra) -> CacheIdentity {
    let cache = session.cache();
    CacheIdentity::new(
        cache.shape(),
        cache.config(),
        IdentityInputs {
            model_hash,
            tokenizer_hash: extra.tokenizer_hash,
            chat_template_hash: extra.chat_template_hash,
            context_tokens: session.tokens().len() as u64,
            context_digest: context_digest(session.tokens(), cache.retired(), cache.gap()),
            runtime_build: runtime_build(),
        },
    )
}

pub fn identity_dict<'py>(
    py: Python<'py>,
    identity: &CacheIdentity,
) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    for (name, value) in identity.fields() {
        d.set_item(name, value)?;
    }
    d.set_item("context_tokens", identity.context_tokens)?;
    Ok(d)
}

fn header_dict<'py>(py: Python<'py>, header: &SessionHeader) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("format_version", header.version)?;
    d.set_item("identity", identity_dict(py, &header.identity)?)?;
    d.set_item("transcript", &header.transcript)?;
    d.set_item("file_bytes", header.file_bytes)?;
    d.set_item("state_bytes", header.state_bytes)?;
    d.set_item("tokens", header.identity.context_tokens)?;
    Ok(d)
}

/// The Python exception for a session-file problem at `path`.
pub fn file_error(path: &Path, err: SessionFileError) -> PyErr {
    let message = format!("session file {} {err}", path.display());
    match err {
        SessionFileError::IdentityMismatch(fields) => identity_mismatch(message, fields),
        other if other.transcript_intact() => new_error(Kind::SessionPages, message),
        _ => new_error(Kind::SessionFile, message),
    }
}

/// Writes the session file for `session` to `path` (created or replaced; synced to disk).
/// Returns the number of bytes written.
pub fn save(
    session: &Session,
    model_hash: Digest,
    extra: &IdentityExtra,
    transcript: &str,
    path: &Path,
) -> std::io::Result<usize> {
    let identity = identity_of(session, model_hash, extra);
    let bytes =
        spinkv_session::save_bytes(&identity, transcript, session.tokens(), session.cache());
    let mut file = File::create(path)?;
    file.write_all(&bytes)?;
    file.sync_all()?;
    Ok(bytes.len())
}

/// Reads and fully checks the session file at `path` for `session` (identity included);
/// returns the transcript and the state, or the first problem.
pub fn load_checked(
    session: &Session,
    model_hash: Digest,
    extra: &IdentityExtra,
    path: &Path,
) -> Result<(String, Vec<u32>, KvCache), SessionFileError> {
    if path.is_dir() {
        return Err(SessionFileError::Directory);
    }
    let bytes = std::fs::read(path)?;
    let expected = identity_of(session, model_hash, extra);
    let (header, state) = spinkv_session::restore(&bytes, &expected, session.cache().config())?;
    Ok((header.transcript, state.tokens, state.cache))
}

/// `read_session(path, verify=False) -> dict`: header, identity and transcript of a session
/// file; with `verify`, also `intact` (the whole-file checksum holds).
#[pyfunction]
#[pyo3(signature = (path, verify=false))]
pub fn read_session<'py>(
    py: Python<'py>,
    path: PathBuf,
    verify: bool,
) -> PyResult<Bound<'py, PyDict>> {
    let (header, intact) = py.detach(|| {
        guarded(|| {
            let read = || -> Result<(SessionHeader, Option<bool>), SessionFileError> {
                let header = spinkv_session::read_header(&path)?;
                let intact = if verify {
                    let bytes = std::fs::read(&path)?;
                    let (body, trailer) = bytes.split_at(bytes.len().saturating_sub(32));
                    Some(spinkv_session::digest(body) == trailer)
                } else {
                    None
                };
                Ok((header, intact))
            };
            read().map_err(|e| file_error(&path, e))
        })
    })?;
    let d = header_dict(py, &header)?;
    if let Some(intact) = intact {
        d.set_item("intact", intact)?;
    }
    Ok(d)
}

/// `runtime_build() -> str`: this runtime's build identity (crate version + commit).
#[pyfunction(name = "runtime_build")]
pub fn py_runtime_build() -> String {
    runtime_build()
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(read_session, m)?)?;
    m.add_function(wrap_pyfunction!(py_runtime_build, m)?)?;
    Ok(())
}
