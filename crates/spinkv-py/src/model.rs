//! `Model`: loaded weights, shared by every session made from it.

use std::path::PathBuf;
use std::sync::Arc;

use pyo3::prelude::*;
use pyo3::types::PyDict;
use spinkv_core::{hex, LlamaConfig, Model, ModelHashCell, Session};

use crate::errors::{guarded, model_error, session_error};
use crate::kv_options::kv_config_from_dict;
use crate::session::PySession;

/// The architecture's dimensions under the keys both `Model.config` and `inspect_model` use.
pub(crate) fn put_dimensions(d: &Bound<'_, PyDict>, c: &LlamaConfig) -> PyResult<()> {
    d.set_item("n_layers", c.num_hidden_layers)?;
    d.set_item("hidden_size", c.hidden_size)?;
    d.set_item("intermediate_size", c.intermediate_size)?;
    d.set_item("n_heads", c.num_attention_heads)?;
    d.set_item("n_kv_heads", c.num_key_value_heads)?;
    d.set_item("head_dim", c.head_dim)?;
    d.set_item("vocab_size", c.vocab_size)
}

#[pyclass(name = "Model", module = "spinkv._native", frozen)]
pub struct PyModel {
    pub(crate) inner: Arc<Model>,
    /// Content hash of the weights, computed on first use and shared with the sessions.
    hash: Arc<ModelHashCell>,
}

impl PyModel {
    fn config_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let c = self.inner.config();
        let d = PyDict::new(py);
        put_dimensions(&d, c)?;
        d.set_item("max_context", c.max_position_embeddings)?;
        d.set_item("rope_theta", c.rope.theta)?;
        d.set_item("family", c.family.name())?;
        d.set_item("tie_word_embeddings", c.tie_word_embeddings)?;
        d.set_item("dtype", self.inner.dtype().name())?;
        d.set_item("n_params", c.n_params())?;
        d.set_item("file_bytes", self.inner.file_bytes())?;
        d.set_item("decode_weight_bytes", self.inner.decode_weight_bytes())?;
        d.set_item("kv_bytes_per_token_fp16", c.kv_bytes_per_token_fp16())?;
        d.set_item("bos_token_id", c.bos_token_id)?;
        d.set_item("eos_token_ids", c.eos_token_ids.clone())?;
        d.set_item("architecture", c.architecture.clone())?;
        Ok(d)
    }
}

#[pymethods]
impl PyModel {
    /// Memory-maps an HF-layout model directory (config.json + safetensors) and validates it.
    #[staticmethod]
    fn load(py: Python<'_>, path: PathBuf) -> PyResult<PyModel> {
        let inner = py.detach(|| guarded(|| Model::load(&path).map_err(model_error)))?;
        Ok(PyModel {
            inner,
            hash: Arc::new(ModelHashCell::new()),
        })
    }

    /// Content hash (blake3, hex) of config.json and the safetensors files: computed once per
    /// loaded model, cached on disk by file size and mtime.
    fn content_hash(&self, py: Python<'_>) -> PyResult<String> {
        let (cell, dir) = (&self.hash, self.inner.dir());
        let digest = py.detach(|| guarded(|| cell.labelled(dir).map_err(session_error)))?;
        Ok(hex(&digest))
    }

    /// Architecture figures as a dict (see docs/ARCHITECTURE.md for the keys).
    #[getter]
    fn config<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        guarded(|| self.config_dict(py))
    }

    /// A fresh conversation state with its own KV cache. `kv` selects the cache policy.
    #[pyo3(signature = (kv=None))]
    fn session(&self, kv: Option<&Bound<'_, PyDict>>) -> PyResult<PySession> {
        let model_config = self.inner.config();
        let (context, defaults) = (
            model_config.max_position_embeddings,
            model_config.kv_defaults(),
        );
        let inner = guarded(|| {
            let config = kv_config_from_dict(kv, context, defaults)?;
            Session::new(Arc::clone(&self.inner), config).map_err(model_error)
        })?;
        Ok(PySession {
            inner,
            model_hash: Arc::clone(&self.hash),
        })
    }

    fn __repr__(&self) -> String {
        let c = self.inner.config();
        format!(
            "Model(layers={}, hidden={}, heads={}/{}, vocab={})",
            c.num_hidden_layers,
            c.hidden_size,
            c.num_attention_heads,
            c.num_key_value_heads,
            c.vocab_size
        )
    }
}
