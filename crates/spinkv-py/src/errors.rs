//! The one place where Rust errors and panics become Python exceptions.
//!
//! Hierarchy (all subclasses of `SpinkvError`, itself an `Exception`):
//! `ModelFormatError` (bad or unsupported model files), `InvalidInputError` (bad arguments:
//! sampling values, token ids, prompts longer than the context), `KvCacheError`, and
//! `InternalError` (a caught Rust panic — a bug, never the user's fault).

use std::panic::{catch_unwind, AssertUnwindSafe};

use pyo3::create_exception;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;
use spinkv_kv::KvError;
use spinkv_model::ModelError;

create_exception!(_native, SpinkvError, PyException, "Base of every spinkv error.");
create_exception!(_native, ModelFormatError, SpinkvError, "A model file is missing, corrupt or unsupported.");
create_exception!(_native, InvalidInputError, SpinkvError, "An argument is out of range or malformed.");
create_exception!(_native, KvCacheError, SpinkvError, "The KV cache refused an operation.");
create_exception!(_native, InternalError, SpinkvError, "A bug inside spinkv (a caught Rust panic).");

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("SpinkvError", py.get_type::<SpinkvError>())?;
    m.add("ModelFormatError", py.get_type::<ModelFormatError>())?;
    m.add("InvalidInputError", py.get_type::<InvalidInputError>())?;
    m.add("KvCacheError", py.get_type::<KvCacheError>())?;
    m.add("InternalError", py.get_type::<InternalError>())?;
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
