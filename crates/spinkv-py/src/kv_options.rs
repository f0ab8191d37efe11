//! Cache options between Python and the core: the `kv=` dict of `Model.session` in, resolved
//! options and presets out. Keys, types, the default preset and the merge rule are the core's
//! (`spinkv_core::KvOptions`, `KvConfig::from_options`).

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};
use spinkv_core::{
    KvConfig, KvOptions, ModelKvDefaults, OptionKind, OptionValue, DEFAULT_PRESET, OPTION_KEYS,
    PREFILL_BLOCK_TOKENS, PRESETS,
};

use crate::errors::{guarded, invalid_input, kv_error};

fn option_value(key: &str, kind: OptionKind, value: &Bound<'_, PyAny>) -> PyResult<OptionValue> {
    // A value of the wrong type (a session file's transcript is untrusted) is the user's
    // error, named by its key, not pyo3's TypeError.
    let wrong = |what: &str| invalid_input(format!("{key} must be {what}"));
    Ok(match kind {
        OptionKind::Text => OptionValue::Text(value.extract().map_err(|_| wrong("a string"))?),
        OptionKind::Bits => OptionValue::Bits(value.extract().map_err(|_| wrong("a number"))?),
        OptionKind::Count => OptionValue::Count(value.extract().map_err(|_| wrong("an integer"))?),
        OptionKind::Seed => OptionValue::Seed(value.extract().map_err(|_| wrong("an integer"))?),
        OptionKind::Fraction => {
            OptionValue::Fraction(value.extract().map_err(|_| wrong("a number"))?)
        }
    })
}

/// The options in a Python dict; `None` values count as not given.
pub fn kv_options_from_dict(options: Option<&Bound<'_, PyDict>>) -> PyResult<KvOptions> {
    let mut out = KvOptions::default();
    let Some(options) = options else {
        return Ok(out);
    };
    // Every key first, so a typo is reported even beside a bad value.
    let mut given = Vec::with_capacity(options.len());
    for (key, value) in options.iter() {
        let key: String = key
            .extract()
            .map_err(|_| invalid_input(format!("option name {key} is not a string")))?;
        let kind = KvOptions::kind_of(&key).map_err(kv_error)?;
        given.push((key, kind, value));
    }
    for (key, kind, value) in given.iter().filter(|(_, _, v)| !v.is_none()) {
        let value = option_value(key, *kind, value)?;
        out.set(key, value).map_err(kv_error)?;
    }
    Ok(out)
}

/// The cache policy of a `kv=` dict on a model with `context` positions whose family changes
/// the presets' defaults by `defaults`.
pub fn kv_config_from_dict(
    options: Option<&Bound<'_, PyDict>>,
    context: usize,
    defaults: ModelKvDefaults,
) -> PyResult<KvConfig> {
    let options = kv_options_from_dict(options)?;
    KvConfig::for_model(&options, context, defaults).map_err(kv_error)
}

fn option_object<'py>(py: Python<'py>, value: OptionValue) -> PyResult<Bound<'py, PyAny>> {
    Ok(match value {
        OptionValue::Text(text) => text.into_pyobject(py)?.into_any(),
        OptionValue::Bits(bits) => bits.into_pyobject(py)?.into_any(),
        OptionValue::Count(n) => n.into_pyobject(py)?.into_any(),
        OptionValue::Seed(seed) => seed.into_pyobject(py)?.into_any(),
        OptionValue::Fraction(f) => f.into_pyobject(py)?.into_any(),
    })
}

fn config_dict<'py>(py: Python<'py>, preset: &str, c: &KvConfig) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("preset", preset)?;
    d.set_item("codec", c.codec.name())?;
    d.set_item("k_bits", c.k_bits)?;
    d.set_item("v_bits", c.v_bits)?;
    d.set_item("window", c.window)?;
    d.set_item("page_tokens", c.page_tokens)?;
    d.set_item("sink_tokens", c.sink_tokens)?;
    d.set_item("max_context", c.max_tokens)?;
    d.set_item("key_norm", c.key_norm.name())?;
    d.set_item("kivi_group", c.kivi_group)?;
    d.set_item("seed", c.seed)?;
    d.set_item("sparse_v", c.sparse_v)?;
    Ok(d)
}

/// `kv_options(preset=None, *, context=None, **overrides) -> dict`: every option resolved
/// (the default preset when none is named; `context` is the model's, when known).
#[pyfunction]
#[pyo3(signature = (preset=None, *, context=None, **overrides))]
fn kv_options<'py>(
    py: Python<'py>,
    preset: Option<&Bound<'py, PyAny>>,
    context: Option<usize>,
    overrides: Option<&Bound<'py, PyDict>>,
) -> PyResult<Bound<'py, PyDict>> {
    let all = overrides.map_or_else(|| PyDict::new(py), |d| d.copy().unwrap_or(PyDict::new(py)));
    if let Some(preset) = preset {
        all.set_item("preset", preset)?;
    }
    let options = kv_options_from_dict(Some(&all))?;
    let config = guarded(|| KvConfig::from_options(&options, context).map_err(kv_error))?;
    config_dict(py, options.preset_name(), &config)
}

/// `kv_presets() -> list[dict]`: each preset resolved, with `default` marking the one used
/// when none is named.
#[pyfunction]
fn kv_presets(py: Python<'_>) -> PyResult<Vec<Bound<'_, PyDict>>> {
    PRESETS
        .iter()
        .map(|&name| {
            let config = KvConfig::preset(name).map_err(kv_error)?;
            let d = config_dict(py, name, &config)?;
            d.set_item("default", name == DEFAULT_PRESET)?;
            Ok(d)
        })
        .collect()
}

/// `parse_kv_spec("turbo:window=0:k=3") -> {"preset": "turbo", "window": 0, "k_bits": 3.0}`:
/// the options a spec names, in the order written (short names resolved).
#[pyfunction]
fn parse_kv_spec<'py>(py: Python<'py>, spec: &str) -> PyResult<Bound<'py, PyDict>> {
    let (options, order) = KvOptions::parse_spec(spec).map_err(kv_error)?;
    let d = PyDict::new(py);
    for key in std::iter::once("preset").chain(order) {
        if let Some(value) = options.get(key) {
            d.set_item(key, option_object(py, value)?)?;
        }
    }
    Ok(d)
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("DEFAULT_KV_PRESET", DEFAULT_PRESET)?;
    m.add("KV_PRESETS", PyTuple::new(py, PRESETS)?)?;
    m.add("KV_OPTION_KEYS", PyTuple::new(py, OPTION_KEYS)?)?;
    m.add("PREFILL_BLOCK_TOKENS", PREFILL_BLOCK_TOKENS)?;
    m.add_function(wrap_pyfunction!(kv_options, m)?)?;
    m.add_function(wrap_pyfunction!(kv_presets, m)?)?;
    m.add_function(wrap_pyfunction!(parse_kv_spec, m)?)?;
    Ok(())
}
