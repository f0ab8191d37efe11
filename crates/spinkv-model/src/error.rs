//! Everything that can go wrong in the model layer, one line each.

use std::path::PathBuf;
use thiserror::Error;

#[derive(Debug, Error)]
pub enum ModelError {
    #[error("model directory {0} does not exist or is not a directory")]
    MissingDir(PathBuf),
    #[error("cannot read {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("invalid config.json at {path}: {reason}")]
    Config { path: PathBuf, reason: String },
    #[error("unsupported model architecture {0}: spinkv runs LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM and Gemma3ForCausalLM")]
    UnsupportedArchitecture(String),
    #[error("unsupported model feature: {0}")]
    Unsupported(String),
    #[error("no weights in {0}: expected model.safetensors or model.safetensors.index.json with model-*.safetensors shards")]
    NoWeights(PathBuf),
    #[error("invalid safetensors index {path}: {reason}")]
    Index { path: PathBuf, reason: String },
    #[error("safetensors shard {shard} named in {index} is missing")]
    MissingShard { index: PathBuf, shard: PathBuf },
    #[error("corrupted or truncated safetensors file {path}: {reason}")]
    Safetensors { path: PathBuf, reason: String },
    #[error("tensor {name} is missing from the model weights")]
    MissingTensor { name: String },
    #[error("tensor {name} in {file} has dtype {dtype}; spinkv reads F16, BF16, F32 or Q8_0 (I8)")]
    UnsupportedDtype {
        name: String,
        file: String,
        dtype: String,
    },
    #[error("tensor {name} in {file} has shape {got:?}, but config.json implies {expected:?}")]
    ShapeMismatch {
        name: String,
        file: String,
        expected: Vec<usize>,
        got: Vec<usize>,
    },
    #[error(
        "prompt of {adding} tokens does not fit: {len} tokens already in context, limit {max}"
    )]
    ContextOverflow {
        len: usize,
        adding: usize,
        max: usize,
    },
    #[error("token id {token} at index {index} is outside the vocabulary (size {vocab_size})")]
    TokenOutOfRange {
        token: u32,
        index: usize,
        vocab_size: usize,
    },
    #[error("prefill needs at least one token")]
    EmptyPrompt,
    #[error("no logits yet: prefill or decode a token first")]
    NoLogits,
    #[error("invalid sampling parameter: {0}")]
    InvalidSampling(String),
    #[error("invalid thread count: {0}")]
    Threads(String),
    #[error("bandwidth probe: {0}")]
    Probe(String),
    #[error("too large: {0}")]
    TooLarge(String),
    #[error("KV cache: {0}")]
    Kv(#[from] spinkv_kv::KvError),
}
