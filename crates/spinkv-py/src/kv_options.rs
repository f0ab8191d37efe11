//! The `kv=` dict accepted by `Model.session` → `KvConfig`. Unknown keys are an error so a typo
//! never silently falls back to a default.

use pyo3::prelude::*;
use pyo3::types::PyDict;
use spinkv_kv::{KvConfig, NormFormat};

use crate::errors::{invalid_input, kv_error};

/// The preset used when none is named: the design study's first product mode.
pub const DEFAULT_PRESET: &str = "turbo";

const KEYS: [&str; 10] = [
    "preset",
    "k_bits",
    "v_bits",
    "window",
    "page_tokens",
    "sink_tokens",
    "max_context",
    "key_norm",
    "kivi_group",
    "seed",
];

pub fn kv_config_from_dict(
    options: Option<&Bound<'_, PyDict>>,
    context: usize,
) -> PyResult<KvConfig> {
    let Some(options) = options else {
        return Ok(KvConfig {
            max_tokens: context,
            ..KvConfig::preset(DEFAULT_PRESET).map_err(kv_error)?
        });
    };
    for key in options.keys() {
        let key: String = key.extract()?;
        if !KEYS.contains(&key.as_str()) {
            return Err(invalid_input(format!(
                "unknown KV option {key:?} (expected one of {})",
                KEYS.join(", ")
            )));
        }
    }
    let get = |name: &str| -> PyResult<Option<Bound<'_, PyAny>>> {
        Ok(options.get_item(name)?.filter(|v| !v.is_none()))
    };
    let preset: String = match get("preset")? {
        Some(v) => v.extract()?,
        None => DEFAULT_PRESET.to_string(),
    };
    let mut config = KvConfig::preset(&preset).map_err(kv_error)?;
    config.max_tokens = context;
    if let Some(v) = get("k_bits")? {
        config.k_bits = v.extract()?;
    }
    if let Some(v) = get("v_bits")? {
        config.v_bits = v.extract()?;
    }
    if let Some(v) = get("window")? {
        config.window = extract_count(&v, "window")?;
    }
    if let Some(v) = get("page_tokens")? {
        config.page_tokens = extract_count(&v, "page_tokens")?;
    }
    if let Some(v) = get("sink_tokens")? {
        config.sink_tokens = extract_count(&v, "sink_tokens")?;
    }
    if let Some(v) = get("kivi_group")? {
        config.kivi_group = extract_count(&v, "kivi_group")?;
    }
    if let Some(v) = get("seed")? {
        config.seed = v.extract()?;
    }
    if let Some(v) = get("max_context")? {
        let wanted = extract_count(&v, "max_context")?;
        if wanted == 0 || wanted > context {
            return Err(invalid_input(format!(
                "max_context {wanted} must be in 1..={context} (the model's context length)"
            )));
        }
        config.max_tokens = wanted;
    }
    if let Some(v) = get("key_norm")? {
        let name: String = v.extract()?;
        config.key_norm = match name.as_str() {
            "u8" | "log-u8" => NormFormat::LogU8,
            "f16" => NormFormat::F16,
            other => {
                return Err(invalid_input(format!(
                    "key_norm {other:?} must be \"u8\" or \"f16\""
                )))
            }
        };
    }
    Ok(config)
}

fn extract_count(value: &Bound<'_, PyAny>, name: &str) -> PyResult<usize> {
    let n: i64 = value
        .extract()
        .map_err(|_| invalid_input(format!("{name} must be an integer")))?;
    usize::try_from(n).map_err(|_| invalid_input(format!("{name} must be >= 0, got {n}")))
}
