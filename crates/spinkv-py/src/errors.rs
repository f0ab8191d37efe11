//! The one place where Rust errors and panics become Python exceptions.
//!
//! Hierarchy (all subclasses of `SpinkvError`, itself an `Exception`):
//! `ModelFormatError` (bad or unsupported model files), `InvalidInputError` (bad arguments:
//! sampling values, token ids, prompts longer than the context), `KvCacheError`, and
//! `InternalError` (a caught Rust panic — a bug, never the user's fault), and for session
//! files: `SessionFileError` (unreadable: not a session, truncated, corrupt, from a newer
//! spinkv), `SessionPagesError` (the transcript is intact but the KV pages are damaged) and
//! `IdentityMismatchError` (the pages belong to another model, tokenizer, template, preset or
//! runtime; its `fields` attribute lists the differing identity fields).

use std::panic::{catch_unwind, AssertUnwindSafe};

use pyo3::create_exception;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;
use spinkv_kv::KvError;
use spinkv_model::ModelError;

create_exception!(
    _native,
    SpinkvError,
    PyException,
    "Base of every spinkv error."
);
create_exception!(
    _native,
    ModelFormatError,
    SpinkvError,
    "A model file is missing, corrupt or unsupported."
);
create_exception!(
    _native,
    InvalidInputError,
    SpinkvError,
    "An argument is out of range or malformed."
);
create_exception!(
    _native,
    KvCacheError,
    SpinkvError,
    "The KV cache refused an operation."
);
create_exception!(
    _native,
    InternalError,
    SpinkvError,
    "A bug inside spinkv (a caught Rust panic)."
);
create_exception!(_native, SessionFileError, SpinkvError, "A session file cannot be read: not a session file, truncated, corrupt, or from a newer spinkv.");
create_exception!(
    _native,
    SessionPagesError,
    SpinkvError,
    "A session file's transcript is intact but its KV pages cannot be used."
);
create_exception!(_native, IdentityMismatchError, SpinkvError, "A saved KV cache belongs to another model, tokenizer, template, cache policy or runtime; `fields` names what differs.");

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("SpinkvError", py.get_type::<SpinkvError>())?;
    m.add("ModelFormatError", py.get_type::<ModelFormatError>())?;
    m.add("InvalidInputError", py.get_type::<InvalidInputError>())?;
    m.add("KvCacheError", py.get_type::<KvCacheError>())?;
    m.add("InternalError", py.get_type::<InternalError>())?;
    m.add("SessionFileError", py.get_type::<SessionFileError>())?;
    m.add("SessionPagesError", py.get_type::<SessionPagesError>())?;
    m.add(
        "IdentityMismatchError",
        py.get_type::<IdentityMismatchError>(),
    )?;
    Ok(())
}

pub fn model_error(err: ModelError) -> PyErr {
    let message = err.to_string();
    match err {
        ModelError::Kv(kv) => kv_error(kv),
        ModelError::ContextOverflow { .. }
        | ModelError::TokenOutOfRange { .. }
        | ModelError::EmptyPrompt
        | ModelError::NoLogits
        | ModelError::InvalidSampling(_) => InvalidInputError::new_err(message),
        ModelError::MissingDir(_)
        | ModelError::Io { .. }
        | ModelError::Config { .. }
        | ModelError::UnsupportedArchitecture(_)
        | ModelError::Unsupported(_)
        | ModelError::NoWeights(_)
        | ModelError::Index { .. }
        | ModelError::Safetensors { .. }
        | ModelError::MissingTensor { .. }
        | ModelError::UnsupportedDtype { .. }
        | ModelError::ShapeMismatch { .. } => ModelFormatError::new_err(message),
    }
}

pub fn kv_error(err: KvError) -> PyErr {
    match err {
        KvError::InvalidConfig(_) | KvError::UnknownPreset(_) => {
            InvalidInputError::new_err(err.to_string())
        }
        other => KvCacheError::new_err(other.to_string()),
    }
}

pub fn invalid_input(message: impl Into<String>) -> PyErr {
    InvalidInputError::new_err(message.into())
}

/// Runs `work` and turns a panic into `InternalError` instead of letting it unwind into Python.
pub fn guarded<T>(work: impl FnOnce() -> PyResult<T>) -> PyResult<T> {
    match catch_unwind(AssertUnwindSafe(work)) {
        Ok(result) => result,
        Err(payload) => {
            let detail = payload
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".to_string());
            Err(InternalError::new_err(format!(
                "internal error (please report): {detail}"
            )))
        }
    }
}
