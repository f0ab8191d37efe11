//! The core's own errors. Model and cache errors keep their crates' types (`ModelError`,
//! `KvError`); faces map each to their own error classes.

use std::io;

use spinkv_model::ModelError;
use spinkv_session::SessionFileError;
use thiserror::Error;

/// A bad argument from the caller; the message is complete.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
#[error("{0}")]
pub struct InvalidInput(pub String);

/// Why a session could not be saved, read or restored.
#[derive(Debug, Error)]
pub enum SessionError {
    /// The model's content hash (part of every identity) could not be computed.
    #[error("{0}")]
    ModelHash(String),
    /// The file (or bytes) named by `origin` failed a check; `source` tells whether its
    /// transcript is still readable (`SessionFileError::transcript_intact`).
    #[error("{origin} {source}")]
    File {
        origin: String,
        source: SessionFileError,
    },
    /// Every check passed but the session refused the state (it does not fit it).
    #[error("{origin} cannot be restored into this session: {source}")]
    Restore { origin: String, source: ModelError },
    /// Writing the file failed; faces report it as the OS error it is.
    #[error(transparent)]
    Write(#[from] io::Error),
}

impl SessionError {
    pub(crate) fn file(origin: &str, source: SessionFileError) -> SessionError {
        SessionError::File {
            origin: origin.to_string(),
            source,
        }
    }
}
