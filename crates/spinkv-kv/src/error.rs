//! Typed errors. Every variant is raised before the cache is modified: a failed call leaves the
//! cache exactly as it was.

use thiserror::Error;

#[derive(Debug, Clone, PartialEq, Error)]
pub enum KvError {
    #[error("{what}: expected {expected} values, got {got}")]
    ShapeMismatch {
        what: &'static str,
        expected: usize,
        got: usize,
    },
    #[error("KV context full: {len} tokens cached + {adding} new exceeds max_tokens {max}")]
    ContextFull {
        len: usize,
        adding: usize,
        max: usize,
    },
    #[error("layer {layer} out of range: the cache has {n_layers} layers")]
    LayerOutOfRange { layer: usize, n_layers: usize },
    #[error(
        "queries at positions {start}..{end} in layer {layer} need {end} cached tokens, \
         but the layer holds {len}"
    )]
    PositionOutOfRange {
        layer: usize,
        start: usize,
        end: usize,
        len: usize,
    },
    #[error("invalid KV cache configuration: {0}")]
    InvalidConfig(String),
    /// A cache option a front end passed (unknown key, wrong value); the message is complete.
    #[error("{0}")]
    InvalidOption(String),
    #[error("unknown KV preset {0:?}: expected one of fp16, turbo, turbo-qjl, kivi2, kivi4")]
    UnknownPreset(String),
    #[error(
        "cannot retire {count} tokens: whole pages of {page_tokens} after the head only, \
         {retirable} retirable now"
    )]
    CannotRetire {
        count: usize,
        retirable: usize,
        page_tokens: usize,
    },
    #[error("corrupt KV page: {0}")]
    CorruptPage(#[from] crate::page::PageError),
}
