//! The one place where Rust errors and panics become Python exceptions.
//!
//! The exception classes are defined once, in Python (`spinkv.errors`); this module imports
//! them at module init and raises those very classes, so `except spinkv.SpinkvError` catches
//! what comes from Rust and `_native.IdentityMismatchError is spinkv.errors.IdentityMismatchError`.
//! Mapping: `ModelNotFoundError` (no model directory or weights), `ModelFormatError`
//! (malformed model files), `UnsupportedError` (a well-formed model spinkv cannot run),
//! `InvalidInputError` (bad arguments) and its subclass `ContextOverflowError`, `KvCacheError`,
//! `InternalError` (a caught Rust panic — a bug, never the user's fault), and for session
//! files `SessionFileError`, `SessionPagesError` and `IdentityMismatchError` (its `fields`
//! attribute lists the differing identity fields).

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Once;

use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyType;
use spinkv_core::persist::{mismatched_fields, transcript_survives};
use spinkv_core::{InvalidInput, KvError, ModelError, SessionError};

const ERRORS_MODULE: &str = "spinkv.errors";

/// The exception classes of `spinkv.errors` that Rust raises.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Spinkv,
    ModelNotFound,
    ModelFormat,
    Unsupported,
    InvalidInput,
    ContextOverflow,
    KvCache,
    SessionFile,
    SessionPages,
    SessionBusy,
    IdentityMismatch,
    Internal,
}

impl Kind {
    const ALL: [Kind; 12] = [
        Kind::Spinkv,
        Kind::ModelNotFound,
        Kind::ModelFormat,
        Kind::Unsupported,
        Kind::InvalidInput,
        Kind::ContextOverflow,
        Kind::KvCache,
        Kind::SessionFile,
        Kind::SessionPages,
        Kind::SessionBusy,
        Kind::IdentityMismatch,
        Kind::Internal,
    ];

    fn class_name(self) -> &'static str {
        match self {
            Kind::Spinkv => "SpinkvError",
            Kind::ModelNotFound => "ModelNotFoundError",
            Kind::ModelFormat => "ModelFormatError",
            Kind::Unsupported => "UnsupportedError",
            Kind::InvalidInput => "InvalidInputError",
            Kind::ContextOverflow => "ContextOverflowError",
            Kind::KvCache => "KvCacheError",
            Kind::SessionFile => "SessionFileError",
            Kind::SessionPages => "SessionPagesError",
            Kind::SessionBusy => "SessionBusyError",
            Kind::IdentityMismatch => "IdentityMismatchError",
            Kind::Internal => "InternalError",
        }
    }

    fn slot(self) -> &'static PyOnceLock<Py<PyType>> {
        // One cell per class: the import happens once per process, at module init.
        static CLASSES: [PyOnceLock<Py<PyType>>; 12] = [const { PyOnceLock::new() }; 12];
        &CLASSES[self as usize]
    }

    fn class<'py>(self, py: Python<'py>) -> PyResult<&'py Bound<'py, PyType>> {
        self.slot().import(py, ERRORS_MODULE, self.class_name())
    }
}

/// A `kind` exception with `message`. Works with or without the GIL held (errors are built
/// inside `py.detach` too): it attaches for the moment it takes to look up the class.
pub fn new_error(kind: Kind, message: impl Into<String>) -> PyErr {
    let message = message.into();
    Python::attach(|py| match kind.class(py) {
        Ok(class) => PyErr::from_type(class.clone(), (message,)),
        Err(lookup) => lookup,
    })
}

/// `IdentityMismatchError(message, fields)`: `fields` names the identity fields that differ.
pub fn identity_mismatch(message: String, fields: Vec<&'static str>) -> PyErr {
    Python::attach(|py| match Kind::IdentityMismatch.class(py) {
        Ok(class) => PyErr::from_type(class.clone(), (message, fields)),
        Err(lookup) => lookup,
    })
}

/// Imports the classes (so a broken `spinkv.errors` fails the import of `_native`, not the
/// first error), exposes them as `_native.<Name>`, and installs the quiet panic hook.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    for kind in Kind::ALL {
        m.add(kind.class_name(), kind.class(py)?)?;
    }
    install_panic_hook();
    Ok(())
}

/// `SPINKV_DEBUG` set to anything but "", "0", "false" or "no" (as the CLI reads it).
fn debug_enabled() -> bool {
    std::env::var("SPINKV_DEBUG").is_ok_and(|v| {
        let v = v.trim().to_ascii_lowercase();
        !matches!(v.as_str(), "" | "0" | "false" | "no")
    })
}

/// Panics are caught by `guarded` and reported as `InternalError`; the default hook would
/// first print "thread ... panicked at ..." (and maybe a backtrace) to stderr, which breaks
/// the CLI's one-line errors. With SPINKV_DEBUG the default hook runs as before.
fn install_panic_hook() {
    static INSTALL: Once = Once::new();
    INSTALL.call_once(|| {
        let default_hook = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if debug_enabled() {
                default_hook(info);
            }
        }));
    });
}

pub fn model_error(err: ModelError) -> PyErr {
    let message = err.to_string();
    let kind = match err {
        ModelError::Kv(kv) => return kv_error(kv),
        ModelError::ContextOverflow { .. } => Kind::ContextOverflow,
        ModelError::TokenOutOfRange { .. }
        | ModelError::EmptyPrompt
        | ModelError::NoLogits
        | ModelError::InvalidSampling(_)
        | ModelError::Threads(_)
        | ModelError::Probe(_)
        | ModelError::TooLarge(_) => Kind::InvalidInput,
        ModelError::MissingDir(_) | ModelError::NoWeights(_) | ModelError::MissingShard { .. } => {
            Kind::ModelNotFound
        }
        ModelError::Io { ref source, .. } if source.kind() == std::io::ErrorKind::NotFound => {
            Kind::ModelNotFound
        }
        ModelError::UnsupportedArchitecture(_)
        | ModelError::Unsupported(_)
        | ModelError::UnsupportedDtype { .. } => Kind::Unsupported,
        ModelError::Io { .. }
        | ModelError::Config { .. }
        | ModelError::Index { .. }
        | ModelError::Safetensors { .. }
        | ModelError::MissingTensor { .. }
        | ModelError::ShapeMismatch { .. } => Kind::ModelFormat,
    };
    new_error(kind, message)
}

pub fn kv_error(err: KvError) -> PyErr {
    let kind = match err {
        KvError::InvalidConfig(_) | KvError::InvalidOption(_) | KvError::UnknownPreset(_) => {
            Kind::InvalidInput
        }
        KvError::ContextFull { .. } => Kind::ContextOverflow,
        _ => Kind::KvCache,
    };
    new_error(kind, err.to_string())
}

pub fn invalid_input(message: impl Into<String>) -> PyErr {
    new_error(Kind::InvalidInput, message)
}

/// A bad argument the core refused.
pub fn core_invalid_input(err: InvalidInput) -> PyErr {
    invalid_input(err.0)
}

/// A session save/read/restore problem: an identity mismatch (with its fields), damaged pages
/// whose transcript survives, an unreadable file, or the OS error of a failed write.
pub fn session_error(err: SessionError) -> PyErr {
    if let SessionError::Write(io) = err {
        return io.into();
    }
    let message = err.to_string();
    if let Some(fields) = mismatched_fields(&err) {
        return identity_mismatch(message, fields.to_vec());
    }
    let kind = match transcript_survives(&err) {
        true => Kind::SessionPages,
        false => Kind::SessionFile,
    };
    new_error(kind, message)
}

/// Runs `work` and turns a panic into `InternalError` instead of letting it unwind into
/// Python (where pyo3 would raise `PanicException`, a `BaseException` nobody catches).
pub fn guarded<T>(work: impl FnOnce() -> PyResult<T>) -> PyResult<T> {
    match catch_unwind(AssertUnwindSafe(work)) {
        Ok(result) => result,
        Err(payload) => {
            let detail = payload
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".to_string());
            Err(new_error(
                Kind::Internal,
                format!("internal error (please report): {detail}"),
            ))
        }
    }
}
