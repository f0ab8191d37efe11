//! Session files between Python and the core: identity hashes in, identity records and file
//! headers out. Saving, reading, verifying and restoring are `spinkv_core::persist`.

use std::path::PathBuf;

use pyo3::prelude::*;
use pyo3::types::PyDict;
use spinkv_core::{runtime_build, CacheIdentity, IdentityHashes, SessionHeader};

use crate::errors::{core_invalid_input, guarded, invalid_input, session_error};

/// The `identity_extra` dict: `tokenizer_hash` and `chat_template_hash` as hex strings.
pub fn identity_hashes(extra: Option<&Bound<'_, PyDict>>) -> PyResult<IdentityHashes> {
    let mut hashes = IdentityHashes::default();
    for (key, value) in extra.into_iter().flat_map(|d| d.iter()) {
        let key: String = key.extract()?;
        IdentityHashes::check_field(&key).map_err(core_invalid_input)?;
        let text: String = value
            .extract()
            .map_err(|_| invalid_input(format!("{key} must be a hex string")))?;
        hashes.set_hex(&key, &text).map_err(core_invalid_input)?;
    }
    Ok(hashes)
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
        guarded(|| spinkv_core::persist::read_session(&path, verify).map_err(session_error))
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
    // The first bytes of every session file, for Python's checks before it writes a file.
    m.add(
        "SESSION_MAGIC",
        pyo3::types::PyBytes::new(m.py(), &spinkv_core::SESSION_MAGIC),
    )?;
    Ok(())
}
