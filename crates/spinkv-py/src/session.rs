//! `Session`: one conversation's token history and KV cache.

use std::path::PathBuf;
use std::sync::Arc;

use numpy::{PyArray1, PyArray2, PyArrayMethods};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyInt, PyString};
use spinkv_core::persist::{current_identity, load_session, save_session};
use spinkv_core::{hex, prefix, state_digest, ModelHashCell, Session};

use crate::errors::{
    core_invalid_input, guarded, invalid_input, model_error, new_error, session_error, Kind,
};
use crate::persist::{identity_dict, identity_hashes};
use crate::sampler::PySampler;
use crate::stats::stats_dict;

#[pyclass(name = "Session", module = "spinkv._native")]
pub struct PySession {
    pub(crate) inner: Session,
    /// The model's content hash (shared with the `Model`), for the cache identity.
    pub(crate) model_hash: Arc<ModelHashCell>,
}

/// One token id from Python. Taken as any object, not `u32`, so that -1 or 2**70 is an
/// InvalidInputError naming the id rather than pyo3's OverflowError.
fn token_id(value: &Bound<'_, PyAny>, vocab_size: usize) -> PyResult<u32> {
    let outside = |shown: String| {
        invalid_input(format!(
            "token id {shown} is outside the vocabulary (size {vocab_size})"
        ))
    };
    match value.extract::<i64>() {
        Ok(id) => u32::try_from(id)
            .ok()
            .filter(|&t| (t as usize) < vocab_size)
            .ok_or_else(|| outside(id.to_string())),
        // An int beyond i64 still has a value to show; anything else is not a token id.
        Err(_) if value.is_instance_of::<PyInt>() => Err(outside(value.to_string())),
        Err(_) => Err(invalid_input(format!(
            "token ids must be integers, got {}",
            value
                .get_type()
                .name()
                .map_or_else(|_| "an object".to_string(), |n| n.to_string())
        ))),
    }
}

fn token_ids(tokens: &Bound<'_, PyAny>, vocab_size: usize) -> PyResult<Vec<u32>> {
    if tokens.is_instance_of::<PyString>() {
        return Err(invalid_input(
            "token ids must be a sequence of integers, not a string",
        ));
    }
    let items = tokens
        .try_iter()
        .map_err(|_| invalid_input("token ids must be a sequence of integers"))?;
    items.map(|item| token_id(&item?, vocab_size)).collect()
}

/// A count from Python (a position, a number of tokens): negative or huge is InvalidInputError.
fn count(value: &Bound<'_, PyAny>, name: &str) -> PyResult<usize> {
    value
        .extract::<i64>()
        .ok()
        .and_then(|n| usize::try_from(n).ok())
        .ok_or_else(|| invalid_input(format!("{name} must be an integer >= 0, got {value}")))
}

impl PySession {
    fn vocab_size(&self) -> usize {
        self.inner.model().config().vocab_size
    }

    /// Runs an operation that cannot fail on the session, a panic inside it reported as
    /// `SpinkvError` (see [`guarded`]).
    fn guarded_mut<T>(&mut self, operation: impl FnOnce(&mut Session) -> T) -> PyResult<T> {
        let session = &mut self.inner;
        guarded(|| Ok(operation(session)))
    }
}

#[pymethods]
impl PySession {
    /// Appends `tokens` to the cache (batched). Returns [T, vocab] logits if `all_logits`.
    #[pyo3(signature = (tokens, all_logits=false))]
    fn prefill<'py>(
        &mut self,
        py: Python<'py>,
        tokens: &Bound<'py, PyAny>,
        all_logits: bool,
    ) -> PyResult<Option<Bound<'py, PyArray2<f32>>>> {
        let tokens = token_ids(tokens, self.vocab_size())?;
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
    fn decode(&mut self, py: Python<'_>, token: &Bound<'_, PyAny>) -> PyResult<()> {
        let token = token_id(token, self.vocab_size())?;
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
    fn truncate(&mut self, n: &Bound<'_, PyAny>) -> PyResult<()> {
        let n = count(n, "truncate position")?;
        self.guarded_mut(|session| session.truncate(n))
    }

    fn reset(&mut self) -> PyResult<()> {
        self.guarded_mut(|session| session.reset())
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
    /// over the pool) and `value_blocks_skipped_pct` (the compressed value blocks sparse values
    /// left out; None before any was scanned), or None when it is off.
    fn kv_phase_times<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyDict>>> {
        let Some(times) = self.inner.kv_phase_times() else {
            return Ok(None);
        };
        let d = PyDict::new(py);
        for (name, ns) in times.as_pairs() {
            d.set_item(name.replace("_ns", "_ms"), ns as f64 / 1e6)?;
        }
        d.set_item("value_blocks_skipped_pct", times.value_blocks_skipped_pct())?;
        Ok(Some(d))
    }

    /// KV cache accounting from the pages actually allocated: per layer and total.
    fn cache_stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let session = &self.inner;
        let stats = guarded(|| Ok(session.cache_stats()))?;
        stats_dict(py, &stats)
    }

    // ---- lifecycle ----------------------------------------------------------------------

    /// Records the state a turn starts from (tokens, logits, KV pages): `rollback_turn()`
    /// returns to it exactly, `commit_turn()` keeps the turn.
    fn checkpoint(&mut self) -> PyResult<()> {
        self.guarded_mut(|session| session.checkpoint())
    }

    /// Back to the last checkpoint; False when there is none.
    fn rollback_turn(&mut self) -> PyResult<bool> {
        self.guarded_mut(|session| session.rollback_turn())
    }

    fn commit_turn(&mut self) -> PyResult<()> {
        self.guarded_mut(|session| session.commit_turn())
    }

    /// When on, a full cache retires its oldest pages after the first (the attention sink)
    /// instead of refusing tokens.
    #[pyo3(signature = (on=true))]
    fn set_sliding(&mut self, on: bool) -> PyResult<()> {
        let session = &mut self.inner;
        guarded(|| session.set_sliding(on).map_err(model_error))
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
    /// More than the session's context is an error (nothing is allocated then).
    fn reserve(&mut self, tokens: &Bound<'_, PyAny>) -> PyResult<()> {
        let tokens = count(tokens, "reserve")?;
        let max = self.inner.max_context();
        if tokens > max {
            return Err(new_error(
                Kind::ContextOverflow,
                format!("cannot reserve {tokens} tokens: the session holds at most {max}"),
            ));
        }
        self.guarded_mut(|session| session.reserve(tokens))
    }

    /// Gives back free cache pages beyond the reservation (after `reset`).
    fn trim_memory(&mut self) -> PyResult<()> {
        self.guarded_mut(|session| session.trim_memory())
    }

    /// blake3 (hex) of the tokens and the canonical KV snapshot: equal digests, equal state.
    fn state_digest(&self, py: Python<'_>) -> PyResult<String> {
        let session = &self.inner;
        py.detach(|| guarded(|| Ok(hex(&state_digest(session)))))
    }

    /// Truncates the session to the tokens `prompt` can reuse (its common prefix with the
    /// session's tokens, the prompt's last token always excluded) and returns how many were
    /// kept: prefill `prompt[kept:]` next.
    fn reuse_prefix(&mut self, prompt: &Bound<'_, PyAny>) -> PyResult<usize> {
        let prompt = token_ids(prompt, self.vocab_size())?;
        let session = &mut self.inner;
        guarded(|| prefix::reuse_prefix(session, &prompt).map_err(core_invalid_input))
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
        let hashes = identity_hashes(identity_extra)?;
        let (session, cell) = (&self.inner, &self.model_hash);
        let identity = py.detach(|| {
            guarded(|| current_identity(session, cell, &hashes).map_err(session_error))
        })?;
        identity_dict(py, &identity)
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
        let hashes = identity_hashes(identity_extra)?;
        let (session, cell) = (&self.inner, &self.model_hash);
        py.detach(|| {
            guarded(|| {
                save_session(session, cell, &hashes, transcript, &path).map_err(session_error)
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
        let hashes = identity_hashes(identity_extra)?;
        let (session, cell) = (&mut self.inner, &self.model_hash);
        py.detach(|| guarded(|| load_session(session, cell, &hashes, &path).map_err(session_error)))
    }
}
