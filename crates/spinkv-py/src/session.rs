//! `Session`: one conversation's token history and KV cache.

use std::path::PathBuf;

use numpy::{PyArray1, PyArray2, PyArrayMethods};
use pyo3::prelude::*;
use pyo3::types::PyDict;
use spinkv_kv::{CacheStats, LayerStats};
use spinkv_model::Session;

use crate::errors::{guarded, invalid_input, model_error, SessionPagesError};
use crate::persist::{self, IdentityExtra, ModelHashCell};
use crate::sampler::PySampler;

#[pyclass(name = "Session", module = "spinkv._native")]
pub struct PySession {
    pub(crate) inner: Session,
    /// The model's content hash (shared with the `Model`), for the cache identity.
    pub(crate) model_hash: ModelHashCell,
}

fn token_ids(tokens: Vec<i64>) -> PyResult<Vec<u32>> {
    tokens
        .into_iter()
        .map(|t| u32::try_from(t).map_err(|_| invalid_input(format!("invalid token id {t}"))))
        .collect()
}

#[pymethods]
impl PySession {
    /// Appends `tokens` to the cache (batched). Returns [T, vocab] logits if `all_logits`.
    #[pyo3(signature = (tokens, all_logits=false))]
    fn prefill<'py>(
        &mut self,
        py: Python<'py>,
        tokens: Vec<i64>,
        all_logits: bool,
    ) -> PyResult<Option<Bound<'py, PyArray2<f32>>>> {
        let tokens = token_ids(tokens)?;
        let n = tokens.len();
        let session = &mut self.inner;
        let logits =
            py.detach(|| guarded(|| session.prefill(&tokens, all_logits).map_err(model_error)))?;
        match logits {
            None => Ok(None),
            Some(flat) => {
                let vocab = flat.len().checked_div(n).unwrap_or(0);
                let array = PyArray1::from_vec(py, flat).reshape([n, vocab])?;
                Ok(Some(array))
            }
        }
    }

    /// Appends one token (decode step) and computes its logits.
    fn decode(&mut self, py: Python<'_>, token: i64) -> PyResult<()> {
        let token = token_ids(vec![token])?[0];
        let session = &mut self.inner;
        py.detach(|| guarded(|| session.decode(token).map_err(model_error)))
    }

    /// Logits after the last token, [vocab] f32.
    fn logits<'py>(&self, py: Python<'py>) -> Bound<'py, PyArray1<f32>> {
        PyArray1::from_slice(py, self.inner.last_logits())
    }

    /// Samples the next token from the last logits; the session's tokens are the history.
    fn sample(&mut self, sampler: &mut PySampler) -> PyResult<u32> {
        let session = &mut self.inner;
        guarded(|| session.sample(&mut sampler.inner).map_err(model_error))
    }

    #[getter]
    fn tokens(&self) -> Vec<u32> {
        self.inner.tokens().to_vec()
    }

    fn __len__(&self) -> usize {
        self.inner.len()
    }

    /// Drops every token at position >= n (cache included).
    fn truncate(&mut self, n: usize) -> PyResult<()> {
        let session = &mut self.inner;
        guarded(|| {
            session.truncate(n);
            Ok(())
        })
    }

    fn reset(&mut self) {
        self.inner.reset();
    }

    /// Accumulated phase timings in milliseconds (and token counts).
    fn timings<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let t = self.inner.timings();
        let d = PyDict::new(py);
        d.set_item("prefill_tokens", t.prefill_tokens)?;
        let ms = |ns: u64| ns as f64 / 1e6;
        d.set_item("prefill_ms", ms(t.prefill_ns))?;
        d.set_item("decode_tokens", t.decode_tokens)?;
        d.set_item("decode_ms", ms(t.decode_ns))?;
        d.set_item("samples", t.samples)?;
        d.set_item("sample_ms", ms(t.sample_ns))?;
        d.set_item("attention_ms", ms(t.attention_ns))?;
        d.set_item("matmul_ms", ms(t.matmul_ns))?;
        d.set_item("other_ms", ms(t.other_ns))?;
        Ok(d)
    }

    fn reset_timings(&mut self) {
        self.inner.reset_timings();
    }

    /// Switches the KV cache's phase timers on (from zero) or off. Profiling reads the clock
    /// around every page's key scan, softmax and value scan: use it for a breakdown, not for
    /// a speed figure.
    fn set_kv_profiling(&mut self, on: bool) {
        self.inner.set_kv_profiling(on);
    }

    /// `{phase}_ms` since profiling was switched on (attention phases are thread time summed
    /// over the pool), or None when it is off.
    fn kv_phase_times<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyDict>>> {
        let Some(times) = self.inner.kv_phase_times() else {
            return Ok(None);
        };
        let d = PyDict::new(py);
        for (name, ns) in times.as_pairs() {
            d.set_item(name.replace("_ns", "_ms"), ns as f64 / 1e6)?;
        }
        Ok(Some(d))
    }

    /// KV cache accounting from the pages actually allocated: per layer and total.
    fn cache_stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        stats_dict(py, &self.inner.cache_stats())
    }

    // ---- lifecycle ----------------------------------------------------------------------

    /// Records the state a turn starts from (tokens, logits, KV pages): `rollback_turn()`
    /// returns to it exactly, `commit_turn()` keeps the turn.
    fn checkpoint(&mut self) {
        self.inner.checkpoint();
    }

    /// Back to the last checkpoint; False when there is none.
    fn rollback_turn(&mut self) -> bool {
        self.inner.rollback_turn()
    }

    fn commit_turn(&mut self) {
        self.inner.commit_turn();
    }

    /// When on, a full cache retires its oldest pages after the first (the attention sink)
    /// instead of refusing tokens.
    #[pyo3(signature = (on=true))]
    fn set_sliding(&mut self, on: bool) -> PyResult<()> {
        self.inner.set_sliding(on).map_err(model_error)
    }

    #[getter]
    fn sliding(&self) -> bool {
        self.inner.sliding()
    }

    /// Tokens held by the cache (`len(session)` minus the retired ones).
    #[getter]
    fn cache_len(&self) -> usize {
        self.inner.cache_len()
    }

    /// Tokens dropped from the cache by the sliding window.
    #[getter]
    fn retired(&self) -> usize {
        self.inner.retired()
    }

    /// Pre-allocates cache pages for `tokens` tokens; the pools then grow geometrically.
    fn reserve(&mut self, tokens: usize) {
        self.inner.reserve(tokens);
    }

    /// Gives back free cache pages beyond the reservation (after `reset`).
    fn trim_memory(&mut self) {
        self.inner.trim_memory();
    }

    /// blake3 (hex) of the tokens and the canonical KV snapshot: equal digests, equal state.
    fn state_digest(&self, py: Python<'_>) -> String {
        let session = &self.inner;
        py.detach(|| {
            let mut bytes: Vec<u8> = session
                .tokens()
                .iter()
                .flat_map(|t| t.to_le_bytes())
                .collect();
            session.cache().export_snapshot(&mut bytes);
            spinkv_kv::identity::hex(&spinkv_session::digest(&bytes))
        })
    }

    // ---- persistence --------------------------------------------------------------------

    /// The cache identity record as {field: value}. identity_extra: tokenizer_hash and
    /// chat_template_hash (hex), computed by the caller.
    #[pyo3(signature = (identity_extra=None))]
    fn identity<'py>(
        &self,
        py: Python<'py>,
        identity_extra: Option<&Bound<'py, PyDict>>,
    ) -> PyResult<Bound<'py, PyDict>> {
        let extra = IdentityExtra::from_dict(identity_extra)?;
        let (cell, dir) = (&self.model_hash, self.inner.model().dir());
        let hash = py.detach(|| guarded(|| persist::model_hash(cell, dir)))?;
        persist::identity_dict(py, &persist::identity_of(&self.inner, hash, &extra))
    }

    /// Writes this session (identity, `transcript` JSON text, tokens, KV pages as stored) to
    /// `path`, replacing it, synced to disk. Returns the bytes written. Atomic replacement
    /// (temp file + rename) and locking are the caller's.
    #[pyo3(signature = (path, transcript, identity_extra=None))]
    fn save(
        &self,
        py: Python<'_>,
        path: PathBuf,
        transcript: &str,
        identity_extra: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<usize> {
        let extra = IdentityExtra::from_dict(identity_extra)?;
        let (session, cell) = (&self.inner, &self.model_hash);
        py.detach(|| {
            guarded(|| {
                let hash = persist::model_hash(cell, session.model().dir())?;
                persist::save(session, hash, &extra, transcript, &path).map_err(Into::into)
            })
        })
    }

    /// Restores the session file at `path` into this session and returns its transcript.
    /// Everything is checked first (file, identity, every page) and a fresh cache is swapped
    /// in only then; on any error this session is untouched. Raises SessionFileError
    /// (unreadable), IdentityMismatchError (`fields` lists what differs) or SessionPagesError
    /// (damaged pages); in the last two cases `read_session(path)` still gives the transcript.
    #[pyo3(signature = (path, identity_extra=None))]
    fn load(
        &mut self,
        py: Python<'_>,
        path: PathBuf,
        identity_extra: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<String> {
        let extra = IdentityExtra::from_dict(identity_extra)?;
        let (session, cell) = (&mut self.inner, &self.model_hash);
        let checked = py.detach(|| {
            guarded(|| {
                let hash = persist::model_hash(cell, session.model().dir())?;
                Ok(persist::load_checked(session, hash, &extra, &path))
            })
        })?;
        let (transcript, tokens, cache) = checked.map_err(|e| persist::file_error(py, &path, e))?;
        session.restore(tokens, cache).map_err(|e| {
            SessionPagesError::new_err(format!(
                "session file {} cannot be restored into this session: {e}",
                path.display()
            ))
        })?;
        Ok(transcript)
    }
}

fn layer_dict<'py>(py: Python<'py>, s: &LayerStats) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("tokens", s.tokens)?;
    d.set_item("compressed_tokens", s.compressed_tokens)?;
    d.set_item("fp16_tokens", s.fp16_tokens)?;
    d.set_item("pages_used", s.pages_used)?;
    d.set_item("k_payload_bytes", s.k_payload_bytes)?;
    d.set_item("v_payload_bytes", s.v_payload_bytes)?;
    d.set_item("norm_bytes", s.norm_bytes)?;
    d.set_item("header_bytes", s.header_bytes)?;
    d.set_item("padding_bytes", s.padding_bytes)?;
    d.set_item("window_bytes", s.window_bytes)?;
    d.set_item("allocated_bytes", s.allocated_bytes)?;
    d.set_item("bits_per_channel", s.bits_per_channel)?;
    d.set_item("compression_vs_fp16", s.compression_vs_fp16)?;
    Ok(d)
}

fn stats_dict<'py>(py: Python<'py>, s: &CacheStats) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("codec", s.codec.name())?;
    d.set_item("tokens", s.tokens)?;
    d.set_item("pages_allocated", s.pages_allocated)?;
    d.set_item("pages_free", s.pages_free)?;
    d.set_item("pool_bytes", s.pool_bytes)?;
    d.set_item("fp16_page_bytes", s.fp16_page_bytes)?;
    d.set_item("sealed_page_bytes", s.sealed_page_bytes)?;
    d.set_item("scratch_bytes", s.scratch_bytes)?;
    d.set_item("fp16_equivalent_bytes", s.fp16_equivalent_bytes)?;
    d.set_item("total", layer_dict(py, &s.total)?)?;
    let layers = s
        .layers
        .iter()
        .map(|l| layer_dict(py, l))
        .collect::<PyResult<Vec<_>>>()?;
    d.set_item("layers", layers)?;
    Ok(d)
}
