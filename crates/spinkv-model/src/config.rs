//! `LlamaConfig`: the subset of a Hugging Face config.json that a Llama-family forward needs,
//! validated so that later code can trust every dimension.

use crate::error::ModelError;
use serde::Deserialize;
use std::path::Path;

/// Architectures whose weights and forward match HF `LlamaForCausalLM`.
const LLAMA_ARCHITECTURES: [&str; 2] = ["LlamaForCausalLM", "MistralForCausalLM"];

#[derive(Clone, Debug, PartialEq)]
pub struct LlamaConfig {
    pub architecture: String,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub num_key_value_heads: usize,
    pub head_dim: usize,
    pub rms_norm_eps: f32,
    pub rope_theta: f64,
    /// Positions are divided by this before RoPE (1.0 = no scaling).
    pub rope_linear_factor: f64,
    pub tie_word_embeddings: bool,
    pub vocab_size: usize,
    pub max_position_embeddings: usize,
    /// As written in config.json ("float16", "bfloat16", ...), informational only: the weights'
    /// own dtypes are what the runtime reads.
    pub torch_dtype: Option<String>,
    pub bos_token_id: Option<u32>,
    pub eos_token_ids: Vec<u32>,
}

/// config.json as written by transformers; unknown keys are ignored.
#[derive(Deserialize)]
struct RawConfig {
    architectures: Option<Vec<String>>,
    model_type: Option<String>,
    hidden_size: usize,
    intermediate_size: usize,
    num_hidden_layers: usize,
    num_attention_heads: usize,
    num_key_value_heads: Option<usize>,
    head_dim: Option<usize>,
    #[serde(default = "default_eps")]
    rms_norm_eps: f64,
    #[serde(default = "default_theta")]
    rope_theta: f64,
    rope_scaling: Option<serde_json::Value>,
    #[serde(default)]
    tie_word_embeddings: bool,
    vocab_size: usize,
    #[serde(default = "default_max_positions")]
    max_position_embeddings: usize,
    torch_dtype: Option<String>,
    hidden_act: Option<String>,
    #[serde(default)]
    attention_bias: bool,
    #[serde(default)]
    mlp_bias: bool,
    sliding_window: Option<serde_json::Value>,
    bos_token_id: Option<serde_json::Value>,
    eos_token_id: Option<serde_json::Value>,
}

/// Positions are u32 in KV page headers.
const MAX_POSITIONS: usize = u32::MAX as usize;

/// serde_json's message, prefixed with the key whose value it could not take (its messages
/// give a line and column only), and with a hint for NaN/Infinity, which JSON does not have.
fn describe_json_error(text: &str, err: &serde_json::Error) -> String {
    let key =
        line_column_offset(text, err.line(), err.column()).and_then(|at| key_before(&text[..at]));
    let Some((key, colon)) = key else {
        return err.to_string();
    };
    let value = text[colon + 1..].trim_start();
    match ["NaN", "Infinity", "-Infinity"]
        .into_iter()
        .find(|word| value.starts_with(word))
    {
        Some(word) => {
            format!("{key} is {word}, which is not valid JSON (a finite number is required)")
        }
        None => format!("{key}: {err}"),
    }
}

/// Byte offset of serde_json's 1-based line and column (the column counts bytes).
fn line_column_offset(text: &str, line: usize, column: usize) -> Option<usize> {
    let line_start = if line <= 1 {
        0
    } else {
        text.match_indices('\n').nth(line - 2)?.0 + 1
    };
    let at = line_start.checked_add(column)?.min(text.len());
    text.is_char_boundary(at).then_some(at)
}

/// The object key whose value ends `before` (`..."key": value` → `key`) and the offset of
/// its colon, if it looks like one.
fn key_before(before: &str) -> Option<(&str, usize)> {
    let colon = before.rfind(':')?;
    let quoted = before[..colon].trim_end().strip_suffix('"')?;
    let open = quoted.rfind('"')?;
    let key = &quoted[open + 1..];
    let plain = !key.is_empty() && key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    plain.then_some((key, colon))
}

fn default_eps() -> f64 {
    1e-6
}
fn default_theta() -> f64 {
    10000.0
}
fn default_max_positions() -> usize {
    2048
}

impl LlamaConfig {
    pub fn from_file(path: &Path) -> Result<Self, ModelError> {
        let text = std::fs::read_to_string(path).map_err(|source| ModelError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        Self::from_json(&text).map_err(|err| match err {
            ModelError::Config { reason, .. } => ModelError::Config {
                path: path.to_path_buf(),
                reason,
            },
            other => other,
        })
    }

    /// Parse and validate config.json text (errors carry an empty path; `from_file` fills it).
    pub fn from_json(text: &str) -> Result<Self, ModelError> {
        let bad = |reason: String| ModelError::Config {
            path: Default::default(),
            reason,
        };
        let raw: RawConfig =
            serde_json::from_str(text).map_err(|e| bad(describe_json_error(text, &e)))?;

        let architecture = match (&raw.architectures, &raw.model_type) {
            (Some(list), _) if !list.is_empty() => list[0].clone(),
            (_, Some(model_type)) if model_type == "llama" => "LlamaForCausalLM".to_string(),
            (_, Some(model_type)) => {
                return Err(ModelError::UnsupportedArchitecture(model_type.clone()))
            }
            _ => return Err(bad("neither `architectures` nor `model_type` is set".into())),
        };
        if !LLAMA_ARCHITECTURES.contains(&architecture.as_str()) {
            return Err(ModelError::UnsupportedArchitecture(architecture));
        }
        if let Some(act) = &raw.hidden_act {
            if act != "silu" {
                return Err(ModelError::Unsupported(format!(
                    "hidden_act {act:?} (only silu/SwiGLU is implemented)"
                )));
            }
        }
        if raw.attention_bias || raw.mlp_bias {
            return Err(ModelError::Unsupported("attention_bias / mlp_bias".into()));
        }
        if let Some(window) = &raw.sliding_window {
            if !window.is_null() {
                return Err(ModelError::Unsupported(format!(
                    "sliding_window attention ({window})"
                )));
            }
        }
        let rope_linear_factor = parse_rope_scaling(raw.rope_scaling.as_ref())?;

        let num_key_value_heads = raw.num_key_value_heads.unwrap_or(raw.num_attention_heads);
        // Zero sizes first: every division and modulo below relies on them being positive.
        for (key, value) in [
            ("hidden_size", raw.hidden_size),
            ("intermediate_size", raw.intermediate_size),
            ("num_hidden_layers", raw.num_hidden_layers),
            ("num_attention_heads", raw.num_attention_heads),
            ("num_key_value_heads", num_key_value_heads),
            ("vocab_size", raw.vocab_size),
            ("max_position_embeddings", raw.max_position_embeddings),
        ] {
            if value == 0 {
                return Err(bad(format!("{key} must be positive, got 0")));
            }
        }
        if raw.max_position_embeddings > MAX_POSITIONS {
            return Err(bad(format!(
                "max_position_embeddings {} exceeds {MAX_POSITIONS} (positions are 32-bit)",
                raw.max_position_embeddings
            )));
        }
        if !raw.num_attention_heads.is_multiple_of(num_key_value_heads) {
            return Err(bad(format!(
                "num_attention_heads {} is not a multiple of num_key_value_heads {}",
                raw.num_attention_heads, num_key_value_heads
            )));
        }
        let head_dim = match raw.head_dim {
            Some(d) => d,
            None if raw.hidden_size.is_multiple_of(raw.num_attention_heads) => {
                raw.hidden_size / raw.num_attention_heads
            }
            None => {
                return Err(bad(format!(
                    "hidden_size {} is not divisible by num_attention_heads {} and head_dim is not given",
                    raw.hidden_size, raw.num_attention_heads
                )))
            }
        };
        if head_dim == 0 || head_dim % 2 != 0 {
            return Err(bad(format!(
                "head_dim {head_dim} must be even and positive (RoPE pairs)"
            )));
        }
        // Every weight matrix's byte size must be representable: the products are used to size
        // and bounds-check buffers, where a wrapped value would be a wrong size.
        let f32_bytes = |rows: Option<usize>, cols: usize| {
            rows.and_then(|r| r.checked_mul(cols))
                .and_then(|n| n.checked_mul(std::mem::size_of::<f32>()))
        };
        let q_width = raw.num_attention_heads.checked_mul(head_dim);
        let kv_width = num_key_value_heads.checked_mul(head_dim);
        for (what, bytes) in [
            (
                "vocab_size x hidden_size",
                f32_bytes(Some(raw.vocab_size), raw.hidden_size),
            ),
            (
                "intermediate_size x hidden_size",
                f32_bytes(Some(raw.intermediate_size), raw.hidden_size),
            ),
            (
                "num_attention_heads x head_dim x hidden_size",
                f32_bytes(q_width, raw.hidden_size),
            ),
            (
                "num_key_value_heads x head_dim x hidden_size",
                f32_bytes(kv_width, raw.hidden_size),
            ),
            (
                "num_hidden_layers x num_key_value_heads x head_dim",
                f32_bytes(kv_width, raw.num_hidden_layers),
            ),
        ] {
            if bytes.is_none() {
                return Err(bad(format!("{what} is too large")));
            }
        }
        if !(raw.rms_norm_eps.is_finite() && raw.rms_norm_eps > 0.0) {
            return Err(bad(format!(
                "rms_norm_eps {} must be a finite number > 0",
                raw.rms_norm_eps
            )));
        }
        if !(raw.rope_theta.is_finite() && raw.rope_theta > 0.0) {
            return Err(bad(format!(
                "rope_theta {} must be a finite number > 0",
                raw.rope_theta
            )));
        }

        Ok(LlamaConfig {
            architecture,
            hidden_size: raw.hidden_size,
            intermediate_size: raw.intermediate_size,
            num_hidden_layers: raw.num_hidden_layers,
            num_attention_heads: raw.num_attention_heads,
            num_key_value_heads,
            head_dim,
            rms_norm_eps: raw.rms_norm_eps as f32,
            rope_theta: raw.rope_theta,
            rope_linear_factor,
            tie_word_embeddings: raw.tie_word_embeddings,
            vocab_size: raw.vocab_size,
            max_position_embeddings: raw.max_position_embeddings,
            torch_dtype: raw.torch_dtype,
            bos_token_id: raw
                .bos_token_id
                .as_ref()
                .and_then(|v| token_ids(v).first().copied()),
            eos_token_ids: raw.eos_token_id.as_ref().map(token_ids).unwrap_or_default(),
        })
    }

    /// `num_attention_heads * head_dim`: width of Q and of the attention output.
    pub fn q_width(&self) -> usize {
        self.num_attention_heads * self.head_dim
    }

    /// `num_key_value_heads * head_dim`: width of K and of V.
    pub fn kv_width(&self) -> usize {
        self.num_key_value_heads * self.head_dim
    }

    /// Parameter count implied by the shapes (lm_head counted once when tied).
    pub fn n_params(&self) -> usize {
        let (h, m, v) = (self.hidden_size, self.intermediate_size, self.vocab_size);
        let attention = h * self.q_width() * 2 + h * self.kv_width() * 2;
        let per_layer = attention + 3 * h * m + 2 * h;
        let lm_head = if self.tie_word_embeddings { 0 } else { v * h };
        v * h + self.num_hidden_layers * per_layer + h + lm_head
    }

    /// fp16 KV-cache bytes per token (K and V, all layers).
    pub fn kv_bytes_per_token_fp16(&self) -> usize {
        2 * 2 * self.num_hidden_layers * self.kv_width()
    }
}

fn parse_rope_scaling(value: Option<&serde_json::Value>) -> Result<f64, ModelError> {
    let Some(value) = value.filter(|v| !v.is_null()) else {
        return Ok(1.0);
    };
    let kind = value
        .get("rope_type")
        .or_else(|| value.get("type"))
        .and_then(|v| v.as_str())
        .unwrap_or("<missing>");
    match kind {
        "default" => Ok(1.0),
        "linear" => match value.get("factor").and_then(|f| f.as_f64()) {
            Some(factor) if factor.is_finite() && factor > 0.0 => Ok(factor),
            _ => Err(ModelError::Config {
                path: Default::default(),
                reason: format!("rope_scaling linear needs a positive factor, got {value}"),
            }),
        },
        other => Err(ModelError::Unsupported(format!(
            "rope_scaling type {other:?} (supported: none, linear)"
        ))),
    }
}

/// `eos_token_id` may be a number or a list of numbers.
fn token_ids(value: &serde_json::Value) -> Vec<u32> {
    match value {
        serde_json::Value::Array(items) => items.iter().filter_map(as_token_id).collect(),
        other => as_token_id(other).into_iter().collect(),
    }
}

fn as_token_id(value: &serde_json::Value) -> Option<u32> {
    value.as_u64().and_then(|v| u32::try_from(v).ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    const SMOLLM2: &str = r#"{
        "architectures": ["LlamaForCausalLM"], "hidden_size": 576, "intermediate_size": 1536,
        "num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3,
        "rms_norm_eps": 1e-5, "rope_theta": 100000.0, "rope_scaling": null,
        "tie_word_embeddings": true, "vocab_size": 49152, "max_position_embeddings": 8192,
        "torch_dtype": "bfloat16", "hidden_act": "silu", "bos_token_id": 1, "eos_token_id": [2]
    }"#;

    #[test]
    fn parses_smollm2() {
        let c = LlamaConfig::from_json(SMOLLM2).unwrap();
        assert_eq!(c.head_dim, 64);
        assert_eq!(c.kv_width(), 192);
        assert_eq!(c.rope_linear_factor, 1.0);
        assert_eq!(c.eos_token_ids, vec![2]);
        assert_eq!(c.kv_bytes_per_token_fp16(), 23_040);
        assert_eq!(c.n_params(), 134_515_008);
    }

    fn with(key: &str, value: &str) -> String {
        let mut v: serde_json::Value = serde_json::from_str(SMOLLM2).unwrap();
        v[key] = serde_json::from_str(value).unwrap();
        v.to_string()
    }

    #[test]
    fn rejects_other_architectures() {
        let err =
            LlamaConfig::from_json(&with("architectures", r#"["GPT2LMHeadModel"]"#)).unwrap_err();
        assert!(
            matches!(err, ModelError::UnsupportedArchitecture(ref a) if a == "GPT2LMHeadModel")
        );
        assert!(err.to_string().contains("GPT2LMHeadModel"));
    }

    #[test]
    fn rope_scaling_linear_and_unsupported() {
        let c = LlamaConfig::from_json(&with("rope_scaling", r#"{"type":"linear","factor":4.0}"#))
            .unwrap();
        assert_eq!(c.rope_linear_factor, 4.0);
        let err = LlamaConfig::from_json(&with(
            "rope_scaling",
            r#"{"rope_type":"yarn","factor":4.0}"#,
        ))
        .unwrap_err();
        assert!(matches!(err, ModelError::Unsupported(_)));
    }

    #[test]
    fn invalid_shapes_and_json_are_errors() {
        for (key, value) in [
            ("num_key_value_heads", "4"),
            ("hidden_size", "0"),
            ("head_dim", "63"),
            ("vocab_size", "-3"),
            ("hidden_act", r#""gelu""#),
        ] {
            assert!(
                LlamaConfig::from_json(&with(key, value)).is_err(),
                "{key}={value}"
            );
        }
        assert!(LlamaConfig::from_json("{not json").is_err());
        assert!(LlamaConfig::from_json(r#"{"architectures":["LlamaForCausalLM"]}"#).is_err());
    }

    fn reason(text: &str) -> String {
        match LlamaConfig::from_json(text) {
            Err(ModelError::Config { reason, .. }) => reason,
            other => panic!("expected a config error, got {other:?}"),
        }
    }

    #[test]
    fn every_bad_value_is_named_in_one_line() {
        for (key, value, expected) in [
            (
                "num_attention_heads",
                "0",
                "num_attention_heads must be positive",
            ),
            (
                "num_key_value_heads",
                "0",
                "num_key_value_heads must be positive",
            ),
            (
                "num_hidden_layers",
                "0",
                "num_hidden_layers must be positive",
            ),
            (
                "max_position_embeddings",
                "0",
                "max_position_embeddings must be positive",
            ),
            (
                "max_position_embeddings",
                "4294967296",
                "positions are 32-bit",
            ),
            (
                "rms_norm_eps",
                "-1",
                "rms_norm_eps -1 must be a finite number > 0",
            ),
            (
                "rms_norm_eps",
                "0",
                "rms_norm_eps 0 must be a finite number > 0",
            ),
            (
                "rope_theta",
                "0",
                "rope_theta 0 must be a finite number > 0",
            ),
            (
                "rope_theta",
                "-1",
                "rope_theta -1 must be a finite number > 0",
            ),
            ("rope_theta", "1e999", "rope_theta: "),
            (
                "rope_theta",
                "NaN",
                "rope_theta is NaN, which is not valid JSON",
            ),
            ("rms_norm_eps", "Infinity", "rms_norm_eps is Infinity"),
            ("rms_norm_eps", "-Infinity", "rms_norm_eps is -Infinity"),
            (
                "num_hidden_layers",
                "-1",
                "num_hidden_layers: invalid value",
            ),
            (
                "num_hidden_layers",
                "18446744073709551616",
                "num_hidden_layers: ",
            ),
            ("num_hidden_layers", "18446744073709551615", "too large"),
            ("head_dim", "4611686018427387904", "too large"),
            ("vocab_size", "4611686018427387904", "too large"),
        ] {
            // Splice the raw token in: serde_json::Value cannot hold NaN.
            let text = with(key, r#""SPLICE""#).replace(r#""SPLICE""#, value);
            let got = reason(&text);
            assert!(got.contains(expected), "{key}={value}: {got}");
            assert!(!got.contains('\n'), "{got}");
        }
    }
}
