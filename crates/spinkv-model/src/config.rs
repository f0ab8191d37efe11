//! `LlamaConfig`: the subset of a Hugging Face config.json that the decoder-only families spinkv
//! runs need (Llama, Mistral, Qwen2, Qwen3, Gemma 3), validated so that later code can trust
//! every dimension, and each family's quirks as plain fields the forward pass reads.

use crate::error::ModelError;
use serde::Deserialize;
use spinkv_kv::ModelKvDefaults;
use std::path::Path;

/// The architectures (config.json `architectures[0]`) spinkv runs, and the `model_type` of each.
const FAMILIES: [(&str, &str, Family); 5] = [
    ("LlamaForCausalLM", "llama", Family::Llama),
    ("MistralForCausalLM", "mistral", Family::Mistral),
    ("Qwen2ForCausalLM", "qwen2", Family::Qwen2),
    ("Qwen3ForCausalLM", "qwen3", Family::Qwen3),
    ("Gemma3ForCausalLM", "gemma3_text", Family::Gemma3),
];

/// Key bits of the turbo codec on Gemma 3 unless the user sets them ([`LlamaConfig::kv_defaults`]).
pub const GEMMA3_TURBO_K_BITS: f32 = 4.0;
/// Value bits of the turbo codec on Gemma 3 unless the user sets them.
pub const GEMMA3_TURBO_V_BITS: f32 = 2.5;

/// Decoder families; what each changes is spelled out in [`LlamaConfig`]'s fields.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    Llama,
    Mistral,
    /// Q/K/V projections with biases.
    Qwen2,
    /// RMSNorm of every query and key head before RoPE.
    Qwen3,
    /// Q/K norm, norms before and after attention and MLP, `(1 + w)` norm gains, GeGLU,
    /// embeddings × sqrt(hidden), interleaved sliding-window and global layers.
    Gemma3,
}

impl Family {
    pub fn name(self) -> &'static str {
        match self {
            Family::Llama => "llama",
            Family::Mistral => "mistral",
            Family::Qwen2 => "qwen2",
            Family::Qwen3 => "qwen3",
            Family::Gemma3 => "gemma3",
        }
    }
}

/// The MLP's gate activation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Activation {
    /// SwiGLU: `silu(gate) * up`.
    Silu,
    /// GeGLU with the tanh approximation of GELU (`gelu_pytorch_tanh`).
    GeluTanh,
}

/// How RoPE frequencies are scaled (HF `rope_scaling` / `rope_parameters`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum RopeScaling {
    None,
    /// Positions divided by the factor.
    Linear(f64),
    /// Llama 3.x: low frequencies divided by `factor`, high ones kept, a smooth ramp between.
    Llama3 {
        factor: f64,
        low_freq_factor: f64,
        high_freq_factor: f64,
        original_max_position_embeddings: f64,
    },
}

/// RoPE of one kind of layer: base and scaling.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Rope {
    pub theta: f64,
    pub scaling: RopeScaling,
}

impl Rope {
    /// Inverse frequency of each rotation pair (`head_dim / 2` of them), as transformers'
    /// `ROPE_INIT_FUNCTIONS` compute them; linear scaling is applied here too.
    pub fn inv_freq(&self, head_dim: usize) -> Vec<f64> {
        let base: Vec<f64> = (0..head_dim / 2)
            .map(|i| 1.0 / self.theta.powf((2 * i) as f64 / head_dim as f64))
            .collect();
        match self.scaling {
            RopeScaling::None => base,
            RopeScaling::Linear(factor) => base.iter().map(|f| f / factor).collect(),
            RopeScaling::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_max_position_embeddings: old,
            } => {
                let low_freq_wavelen = old / low_freq_factor;
                let high_freq_wavelen = old / high_freq_factor;
                base.iter()
                    .map(|&f| {
                        let wavelen = 2.0 * std::f64::consts::PI / f;
                        if wavelen < high_freq_wavelen {
                            f
                        } else if wavelen > low_freq_wavelen {
                            f / factor
                        } else {
                            let smooth = (old / wavelen - low_freq_factor)
                                / (high_freq_factor - low_freq_factor);
                            (1.0 - smooth) * f / factor + smooth * f
                        }
                    })
                    .collect()
            }
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct LlamaConfig {
    pub architecture: String,
    pub family: Family,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub num_key_value_heads: usize,
    pub head_dim: usize,
    pub rms_norm_eps: f32,
    /// RoPE of global layers (every layer but the sliding-window ones of Gemma 3).
    pub rope: Rope,
    /// RoPE of sliding-window layers, when the family gives them their own base (Gemma 3).
    pub local_rope: Option<Rope>,
    /// Which layers attend through a sliding window, and how wide (see [`LlamaConfig::window`]).
    pub windows: LayerWindows,
    /// Q/K/V projections carry biases (Qwen2; Llama's `attention_bias`).
    pub qkv_bias: bool,
    /// o_proj carries a bias (Llama's `attention_bias`).
    pub o_bias: bool,
    /// RMSNorm over each query and key head before RoPE (Qwen3, Gemma 3).
    pub qk_norm: bool,
    /// Gemma's norms: gains stored as `w` and applied as `1 + w`, a norm after attention and
    /// after the MLP as well as before each.
    pub gemma_norms: bool,
    pub activation: Activation,
    /// Embeddings are multiplied by this (Gemma: sqrt(hidden_size)).
    pub embed_scale: f32,
    /// Softmax scale of attention scores (`1/sqrt(head_dim)` unless the config says otherwise).
    pub attention_scale: f64,
    /// `attention_scale · sqrt(head_dim)`: what queries are multiplied by before the cache's
    /// attention (which scales by `1/sqrt(head_dim)`); exactly 1 unless the config says otherwise.
    pub query_scale: f32,
    /// `cap · tanh(logits / cap)` on the output logits, when set.
    pub final_logit_softcapping: Option<f32>,
    pub tie_word_embeddings: bool,
    pub vocab_size: usize,
    pub max_position_embeddings: usize,
    /// As written in config.json ("float16", "bfloat16", ...), informational only: the weights'
    /// own dtypes are what the runtime reads.
    pub torch_dtype: Option<String>,
    pub bos_token_id: Option<u32>,
    pub eos_token_ids: Vec<u32>,
}

/// The sliding window of every layer, as a rule (a layer count from config.json may be huge
/// before the weights are checked, so nothing here is sized by it).
#[derive(Clone, Debug, PartialEq)]
pub enum LayerWindows {
    /// Every layer attends globally.
    None,
    /// Every layer from `first` on has the window (Mistral: from 0; Qwen: max_window_layers).
    From { first: usize, window: usize },
    /// Gemma 3: layer `i` is global when `(i + 1) % pattern == 0`, else windowed.
    Pattern { pattern: usize, window: usize },
    /// config.json's `layer_types`, one entry per layer.
    Listed(Vec<Option<usize>>),
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
    rope_theta: Option<f64>,
    rope_scaling: Option<serde_json::Value>,
    /// transformers 5: `{rope_type, rope_theta, ...}`, or one such object per layer type.
    rope_parameters: Option<serde_json::Value>,
    rope_local_base_freq: Option<f64>,
    #[serde(default)]
    tie_word_embeddings: Option<bool>,
    vocab_size: usize,
    #[serde(default = "default_max_positions")]
    max_position_embeddings: usize,
    torch_dtype: Option<String>,
    dtype: Option<String>,
    hidden_act: Option<String>,
    hidden_activation: Option<String>,
    attention_bias: Option<bool>,
    #[serde(default)]
    mlp_bias: bool,
    sliding_window: Option<serde_json::Value>,
    use_sliding_window: Option<bool>,
    max_window_layers: Option<usize>,
    layer_types: Option<Vec<String>>,
    sliding_window_pattern: Option<usize>,
    query_pre_attn_scalar: Option<f64>,
    final_logit_softcapping: Option<f64>,
    attn_logit_softcapping: Option<f64>,
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
fn default_max_positions() -> usize {
    2048
}

impl LlamaConfig {
    /// How this family changes the cache presets' defaults. Gemma 3's per-head k-norm leaves a
    /// few high-gain channels carrying most of each key, and the rotated quantiser's error
    /// scales with the whole key: at 3.5 key bits its logits move ~4× more (KLD vs the fp16
    /// cache) than at 4 (README, "Gemma 3 270M"), so its turbo keys get 4 bits. Its values
    /// lose next to nothing at 2.5 bits instead of 3 (KLD within the bootstrap interval on three
    /// texts, docs/KV_QUALITY.md), which pays the fourth key bit back: the global layers' cache
    /// at 32K tokens is then 4.6× smaller than fp16 instead of 4.3×.
    pub fn kv_defaults(&self) -> ModelKvDefaults {
        match self.family {
            Family::Gemma3 => ModelKvDefaults {
                turbo_k_bits: Some(GEMMA3_TURBO_K_BITS),
                turbo_v_bits: Some(GEMMA3_TURBO_V_BITS),
            },
            _ => ModelKvDefaults::default(),
        }
    }

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
            (_, Some(model_type)) => match FAMILIES.iter().find(|f| f.1 == model_type) {
                Some(family) => family.0.to_string(),
                None => return Err(ModelError::UnsupportedArchitecture(model_type.clone())),
            },
            _ => return Err(bad("neither `architectures` nor `model_type` is set".into())),
        };
        let Some(&(_, _, family)) = FAMILIES.iter().find(|f| f.0 == architecture) else {
            return Err(ModelError::UnsupportedArchitecture(architecture));
        };
        let gemma = family == Family::Gemma3;
        let activation = match raw.hidden_activation.as_ref().or(raw.hidden_act.as_ref()) {
            None if gemma => Activation::GeluTanh,
            None => Activation::Silu,
            Some(act) if act == "silu" && !gemma => Activation::Silu,
            Some(act) if act == "gelu_pytorch_tanh" && gemma => Activation::GeluTanh,
            Some(act) => {
                return Err(ModelError::Unsupported(format!(
                    "hidden_act {act:?} for {} (supported: {})",
                    family.name(),
                    if gemma { "gelu_pytorch_tanh" } else { "silu" }
                )))
            }
        };
        if raw.mlp_bias {
            return Err(ModelError::Unsupported("mlp_bias".into()));
        }
        if raw.attn_logit_softcapping.is_some() {
            return Err(ModelError::Unsupported("attn_logit_softcapping".into()));
        }
        // Qwen2 always has Q/K/V biases (no key in its config); Llama's attention_bias puts
        // one on every attention projection; Qwen3 and Gemma 3 put them on Q/K/V if asked.
        let attention_bias = raw.attention_bias.unwrap_or(false);
        let (qkv_bias, o_bias) = match family {
            Family::Qwen2 => (true, false),
            Family::Llama | Family::Mistral => (attention_bias, attention_bias),
            Family::Qwen3 | Family::Gemma3 => (attention_bias, false),
        };
        let (rope, local_rope) = parse_rope(&raw, family)?;
        let windows = parse_layer_windows(&raw, family)?;
        let final_logit_softcapping = match raw.final_logit_softcapping {
            None => None,
            Some(cap) if cap.is_finite() && cap > 0.0 => Some(cap as f32),
            Some(cap) => {
                return Err(bad(format!(
                    "final_logit_softcapping {cap} must be a finite number > 0"
                )))
            }
        };

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
        // Always false where usize is 32 bits (wasm32): nothing to check there.
        #[allow(clippy::absurd_extreme_comparisons)]
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
        let attention_scale = match raw.query_pre_attn_scalar {
            Some(scalar) if gemma && scalar.is_finite() && scalar > 0.0 => 1.0 / scalar.sqrt(),
            Some(scalar) if gemma => {
                return Err(bad(format!(
                    "query_pre_attn_scalar {scalar} must be a finite number > 0"
                )))
            }
            _ => 1.0 / (head_dim as f64).sqrt(),
        };
        if let LayerWindows::Listed(list) = &windows {
            if list.len() != raw.num_hidden_layers {
                return Err(bad(format!(
                    "layer_types has {} entries for {} layers",
                    list.len(),
                    raw.num_hidden_layers
                )));
            }
        }
        // Exactly 1 unless the scale differs from the kernel's 1/sqrt(head_dim).
        let query_scale = match raw.query_pre_attn_scalar {
            Some(scalar) if gemma && scalar != head_dim as f64 => {
                (head_dim as f64 / scalar).sqrt() as f32
            }
            _ => 1.0,
        };

        Ok(LlamaConfig {
            architecture,
            family,
            hidden_size: raw.hidden_size,
            intermediate_size: raw.intermediate_size,
            num_hidden_layers: raw.num_hidden_layers,
            num_attention_heads: raw.num_attention_heads,
            num_key_value_heads,
            head_dim,
            rms_norm_eps: raw.rms_norm_eps as f32,
            rope,
            local_rope,
            windows,
            qkv_bias,
            o_bias,
            qk_norm: matches!(family, Family::Qwen3 | Family::Gemma3),
            gemma_norms: gemma,
            activation,
            embed_scale: if gemma {
                (raw.hidden_size as f32).sqrt()
            } else {
                1.0
            },
            attention_scale,
            query_scale,
            final_logit_softcapping,
            tie_word_embeddings: raw.tie_word_embeddings.unwrap_or(gemma),
            vocab_size: raw.vocab_size,
            max_position_embeddings: raw.max_position_embeddings,
            torch_dtype: raw.torch_dtype.or(raw.dtype),
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
        let mut attention = h * self.q_width() * 2 + h * self.kv_width() * 2;
        if self.qkv_bias {
            attention += self.q_width() + 2 * self.kv_width();
        }
        if self.o_bias {
            attention += h;
        }
        if self.qk_norm {
            attention += 2 * self.head_dim;
        }
        let norms = if self.gemma_norms { 4 * h } else { 2 * h };
        let per_layer = attention + 3 * h * m + norms;
        let lm_head = if self.tie_word_embeddings { 0 } else { v * h };
        v * h + self.num_hidden_layers * per_layer + h + lm_head
    }

    /// The sliding window of `layer` (`None`: global attention).
    pub fn window(&self, layer: usize) -> Option<usize> {
        match &self.windows {
            LayerWindows::None => None,
            LayerWindows::From { first, window } => (layer >= *first).then_some(*window),
            LayerWindows::Pattern { pattern, window } => {
                (!(layer + 1).is_multiple_of(*pattern)).then_some(*window)
            }
            LayerWindows::Listed(list) => list.get(layer).copied().flatten(),
        }
    }

    /// RoPE of `layer`: Gemma 3's local base on its sliding-window layers, else the global one.
    pub fn rope_of(&self, layer: usize) -> &Rope {
        match (&self.local_rope, self.window(layer)) {
            (Some(local), Some(_)) => local,
            _ => &self.rope,
        }
    }

    /// fp16 KV-cache bytes per token (K and V, all layers).
    pub fn kv_bytes_per_token_fp16(&self) -> usize {
        2 * 2 * self.num_hidden_layers * self.kv_width()
    }
}

fn config_error(reason: String) -> ModelError {
    ModelError::Config {
        path: Default::default(),
        reason,
    }
}

fn positive(what: &str, value: Option<f64>) -> Result<f64, ModelError> {
    match value {
        Some(v) if v.is_finite() && v > 0.0 => Ok(v),
        Some(v) => Err(config_error(format!(
            "{what} {v} must be a finite number > 0"
        ))),
        None => Err(config_error(format!("{what} is missing"))),
    }
}

/// One RoPE description: `rope_theta` (given, or inside the object) and the scaling the object
/// names (`rope_type` or the older `type`).
fn parse_rope_object(
    value: Option<&serde_json::Value>,
    theta: Option<f64>,
) -> Result<Rope, ModelError> {
    let value = value.filter(|v| !v.is_null());
    let number = |key: &str| value.and_then(|v| v.get(key)).and_then(|f| f.as_f64());
    let theta = positive("rope_theta", number("rope_theta").or(theta))?;
    let kind = value
        .and_then(|v| v.get("rope_type").or_else(|| v.get("type")))
        .and_then(|v| v.as_str())
        .unwrap_or("default");
    let scaling = match kind {
        "default" => RopeScaling::None,
        "linear" => RopeScaling::Linear(positive("rope_scaling linear factor", number("factor"))?),
        "llama3" => {
            let low = positive("rope_scaling low_freq_factor", number("low_freq_factor"))?;
            let high = positive("rope_scaling high_freq_factor", number("high_freq_factor"))?;
            if high <= low {
                return Err(config_error(format!(
                    "rope_scaling high_freq_factor {high} must exceed low_freq_factor {low}"
                )));
            }
            RopeScaling::Llama3 {
                factor: positive("rope_scaling factor", number("factor"))?,
                low_freq_factor: low,
                high_freq_factor: high,
                original_max_position_embeddings: positive(
                    "rope_scaling original_max_position_embeddings",
                    number("original_max_position_embeddings"),
                )?,
            }
        }
        other => {
            return Err(ModelError::Unsupported(format!(
                "rope_scaling type {other:?} (supported: default, linear, llama3)"
            )))
        }
    };
    Ok(Rope { theta, scaling })
}

/// Global and (Gemma 3) local RoPE, from `rope_theta` + `rope_scaling` (+ `rope_local_base_freq`)
/// or transformers 5's `rope_parameters` (per layer type for Gemma 3).
fn parse_rope(raw: &RawConfig, family: Family) -> Result<(Rope, Option<Rope>), ModelError> {
    let default_theta = match family {
        Family::Gemma3 => 1_000_000.0,
        _ => 10_000.0,
    };
    let theta = raw.rope_theta.or(Some(default_theta));
    let per_type = raw
        .rope_parameters
        .as_ref()
        .filter(|p| p.get("full_attention").is_some() || p.get("sliding_attention").is_some());
    let (global, local) = match per_type {
        Some(params) => (
            parse_rope_object(params.get("full_attention"), theta)?,
            params
                .get("sliding_attention")
                .map(|p| parse_rope_object(Some(p), Some(10_000.0)))
                .transpose()?,
        ),
        None => (
            parse_rope_object(
                raw.rope_parameters.as_ref().or(raw.rope_scaling.as_ref()),
                theta,
            )?,
            None,
        ),
    };
    let local = match family {
        Family::Gemma3 => Some(match local {
            Some(rope) => rope,
            None => Rope {
                theta: positive(
                    "rope_local_base_freq",
                    raw.rope_local_base_freq.or(Some(10_000.0)),
                )?,
                scaling: RopeScaling::None,
            },
        }),
        _ => None,
    };
    Ok((global, local))
}

/// The sliding window of each layer: `layer_types` when given, else each family's rule.
fn parse_layer_windows(raw: &RawConfig, family: Family) -> Result<LayerWindows, ModelError> {
    let window = match &raw.sliding_window {
        None | Some(serde_json::Value::Null) => None,
        Some(value) => match value.as_u64() {
            Some(w) => Some(
                usize::try_from(w)
                    .map_err(|_| config_error(format!("sliding_window {w} is too large")))?,
            ),
            None => {
                return Err(config_error(format!(
                    "sliding_window {value} is not a token count"
                )))
            }
        },
    };
    // Qwen2/3 configs carry a sliding_window that is only used when use_sliding_window is on.
    let window = match family {
        Family::Qwen2 | Family::Qwen3 if raw.use_sliding_window != Some(true) => None,
        Family::Llama if window.is_some() => {
            return Err(ModelError::Unsupported(
                "sliding_window on a Llama model (use MistralForCausalLM)".into(),
            ))
        }
        _ => window,
    };
    if window == Some(0) {
        return Err(config_error(
            "sliding_window must be positive, got 0".into(),
        ));
    }
    if let Some(types) = &raw.layer_types {
        return types
            .iter()
            .map(|kind| match kind.as_str() {
                "full_attention" => Ok(None),
                "sliding_attention" => window.map(Some).ok_or_else(|| {
                    config_error(
                        "layer_types names sliding_attention but sliding_window is not set".into(),
                    )
                }),
                other => Err(ModelError::Unsupported(format!("layer type {other:?}"))),
            })
            .collect::<Result<Vec<_>, _>>()
            .map(LayerWindows::Listed);
    }
    let Some(window) = window else {
        return Ok(LayerWindows::None);
    };
    Ok(match family {
        Family::Gemma3 => LayerWindows::Pattern {
            pattern: raw.sliding_window_pattern.unwrap_or(6).max(1),
            window,
        },
        Family::Qwen2 | Family::Qwen3 => LayerWindows::From {
            first: raw.max_window_layers.unwrap_or(28),
            window,
        },
        Family::Llama | Family::Mistral => LayerWindows::From { first: 0, window },
    })
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

    #[test]
    fn the_unsupported_architecture_message_names_every_family() {
        let message = ModelError::UnsupportedArchitecture("GPT2LMHeadModel".into()).to_string();
        for (architecture, _, _) in FAMILIES {
            assert!(message.contains(architecture), "{architecture}: {message}");
        }
    }

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
        assert_eq!(c.rope.scaling, RopeScaling::None);
        assert_eq!(c.family, Family::Llama);
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
        assert_eq!(c.rope.scaling, RopeScaling::Linear(4.0));
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

    #[test]
    fn family_quirks_come_from_config_json() {
        let qwen2 =
            LlamaConfig::from_json(&with("architectures", r#"["Qwen2ForCausalLM"]"#).replace(
                r#""hidden_act":"silu""#,
                r#""hidden_act":"silu","use_sliding_window":false,"sliding_window":4096"#,
            ))
            .unwrap();
        assert_eq!(qwen2.family, Family::Qwen2);
        assert!(qwen2.qkv_bias && !qwen2.o_bias && !qwen2.qk_norm);
        assert_eq!(qwen2.windows, LayerWindows::None);
        let qwen3 =
            LlamaConfig::from_json(&with("architectures", r#"["Qwen3ForCausalLM"]"#)).unwrap();
        assert!(qwen3.qk_norm && !qwen3.qkv_bias);
        let mistral =
            LlamaConfig::from_json(&with("architectures", r#"["MistralForCausalLM"]"#).replace(
                r#""hidden_act":"silu""#,
                r#""hidden_act":"silu","sliding_window":4096"#,
            ))
            .unwrap();
        assert!((0..30).all(|i| mistral.window(i) == Some(4096)));
        let err =
            LlamaConfig::from_json(&with("architectures", r#"["Gemma2ForCausalLM"]"#)).unwrap_err();
        assert_eq!(err.to_string().lines().count(), 1, "one line: {err}");
    }

    #[test]
    fn gemma3_layers_alternate_and_use_their_rope_base() {
        let text = r#"{"architectures":["Gemma3ForCausalLM"],"hidden_size":640,
            "intermediate_size":2048,"num_hidden_layers":18,"num_attention_heads":4,
            "num_key_value_heads":1,"head_dim":256,"query_pre_attn_scalar":256,
            "sliding_window":512,"rope_theta":1000000.0,"rope_local_base_freq":10000.0,
            "vocab_size":262144,"max_position_embeddings":32768,"rms_norm_eps":1e-6}"#;
        let c = LlamaConfig::from_json(text).unwrap();
        let globals: Vec<usize> = (0..18).filter(|&i| c.window(i).is_none()).collect();
        assert_eq!(globals, vec![5, 11, 17]);
        assert_eq!(c.window(0), Some(512));
        assert_eq!(c.rope_of(5).theta, 1_000_000.0);
        assert_eq!(c.rope_of(0).theta, 10_000.0);
        assert!(c.tie_word_embeddings && c.gemma_norms && c.qk_norm);
        assert_eq!(c.activation, Activation::GeluTanh);
        assert!((c.embed_scale - 640f32.sqrt()).abs() < 1e-6);
        assert!((c.attention_scale - 1.0 / 16.0).abs() < 1e-12);
    }

    #[test]
    fn llama3_rope_keeps_high_divides_low_and_ramps_between() {
        let rope = Rope {
            theta: 500_000.0,
            scaling: RopeScaling::Llama3 {
                factor: 8.0,
                low_freq_factor: 1.0,
                high_freq_factor: 4.0,
                original_max_position_embeddings: 8192.0,
            },
        };
        let plain = Rope {
            theta: 500_000.0,
            scaling: RopeScaling::None,
        };
        let (scaled, base) = (rope.inv_freq(128), plain.inv_freq(128));
        assert_eq!(scaled[0], base[0]);
        assert_eq!(scaled[63], base[63] / 8.0);
        let ramped = (0..64).filter(|&i| scaled[i] < base[i] && scaled[i] > base[i] / 8.0);
        assert!(ramped.count() > 0);
    }
}
