//! `inspect_model(path) -> dict`: what a model directory holds, as the loader would see it
//! (`spinkv_core::inspect_model`).

use std::path::PathBuf;

use pyo3::prelude::*;
use pyo3::types::PyDict;
use spinkv_core::inspect_model as inspect;

use crate::errors::{guarded, model_error};
use crate::model::put_dimensions;

/// Keys: those of `models info` (name, path, architecture, parameters, dtype, size_bytes,
/// context_length, n_layers, hidden_size, n_heads, n_kv_heads, head_dim, vocab_size,
/// kv_bytes_per_token) plus weight_files (the paths the runtime maps), weight_bytes and
/// intermediate_size. A model the loader would refuse (a tensor missing or in a dtype it does
/// not read, found from the headers alone) raises the loader's own error.
#[pyfunction]
fn inspect_model(py: Python<'_>, path: PathBuf) -> PyResult<Bound<'_, PyDict>> {
    let seen = py.detach(|| guarded(|| inspect(&path).map_err(model_error)))?;
    let c = &seen.config;
    let d = PyDict::new(py);
    let name = seen
        .dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned());
    d.set_item("name", name.unwrap_or_default())?;
    d.set_item("path", &seen.dir)?;
    d.set_item("architecture", &c.architecture)?;
    d.set_item("parameters", seen.parameters)?;
    d.set_item("dtype", &seen.dtype)?;
    d.set_item("size_bytes", seen.dir_bytes)?;
    d.set_item("context_length", c.max_position_embeddings)?;
    put_dimensions(&d, c)?;
    d.set_item("kv_bytes_per_token", c.kv_bytes_per_token_fp16())?;
    let files: Vec<&PathBuf> = seen.weight_files.iter().map(|f| &f.path).collect();
    d.set_item("weight_files", files)?;
    d.set_item("weight_bytes", seen.weight_bytes())?;
    Ok(d)
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(inspect_model, m)?)?;
    Ok(())
}
