//! Cache accounting between Python and the core: `CacheStats` out as a dict, and a dict back
//! in for `check_cache_stats` (the invariants are `CacheStats::accounting_problems`).

use pyo3::prelude::*;
use pyo3::types::PyDict;
use spinkv_core::{CacheStats, KvCodecKind, LayerStats};

use crate::errors::invalid_input;

// One list of the per-layer fields, so the dict written and the dict read cannot drift.
macro_rules! layer_counts {
    ($apply:ident) => {
        $apply!(
            tokens,
            compressed_tokens,
            fp16_tokens,
            recycled_tokens,
            window,
            pages_used,
            k_payload_bytes,
            v_payload_bytes,
            norm_bytes,
            header_bytes,
            padding_bytes,
            window_bytes,
            allocated_bytes
        )
    };
}

fn layer_dict<'py>(py: Python<'py>, s: &LayerStats) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    macro_rules! put {
        ($($field:ident),*) => { $(d.set_item(stringify!($field), s.$field)?;)* };
    }
    layer_counts!(put);
    d.set_item("bits_per_channel", s.bits_per_channel)?;
    d.set_item("compression_vs_fp16", s.compression_vs_fp16)?;
    Ok(d)
}

pub fn stats_dict<'py>(py: Python<'py>, s: &CacheStats) -> PyResult<Bound<'py, PyDict>> {
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

fn count(d: &Bound<'_, PyAny>, key: &str) -> PyResult<usize> {
    d.get_item(key)
        .map_err(|_| invalid_input(format!("cache stats lack {key:?}")))?
        .extract()
        .map_err(|_| invalid_input(format!("cache stats {key:?} is not a count")))
}

fn ratio(d: &Bound<'_, PyAny>, key: &str) -> f64 {
    d.get_item(key)
        .and_then(|v| v.extract())
        .unwrap_or_default()
}

fn layer_from(d: &Bound<'_, PyAny>) -> PyResult<LayerStats> {
    let mut s = LayerStats {
        bits_per_channel: ratio(d, "bits_per_channel"),
        compression_vs_fp16: ratio(d, "compression_vs_fp16"),
        ..LayerStats::default()
    };
    macro_rules! take {
        ($($field:ident),*) => { $(s.$field = count(d, stringify!($field))?;)* };
    }
    layer_counts!(take);
    Ok(s)
}

fn stats_from(d: &Bound<'_, PyAny>) -> PyResult<CacheStats> {
    let codec: String = d.get_item("codec")?.extract()?;
    let codec = KvCodecKind::from_name(&codec)
        .ok_or_else(|| invalid_input(format!("unknown codec {codec:?} in cache stats")))?;
    let layers = d
        .get_item("layers")?
        .try_iter()?
        .map(|layer| layer_from(&layer?))
        .collect::<PyResult<Vec<_>>>()?;
    Ok(CacheStats {
        codec,
        layers,
        total: layer_from(&d.get_item("total")?)?,
        tokens: count(d, "tokens")?,
        pages_allocated: count(d, "pages_allocated")?,
        pages_free: count(d, "pages_free")?,
        pool_bytes: count(d, "pool_bytes")?,
        fp16_page_bytes: count(d, "fp16_page_bytes")?,
        sealed_page_bytes: count(d, "sealed_page_bytes")?,
        scratch_bytes: count(d, "scratch_bytes")?,
        fp16_equivalent_bytes: count(d, "fp16_equivalent_bytes")?,
    })
}

/// `check_cache_stats(stats: dict) -> list[str]`: where the figures of a `cache_stats()` dict
/// disagree with each other or with the allocator's page count; empty when they all agree.
#[pyfunction]
fn check_cache_stats(stats: &Bound<'_, PyAny>) -> PyResult<Vec<String>> {
    Ok(stats_from(stats)?.accounting_problems())
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(check_cache_stats, m)?)?;
    Ok(())
}
