//! The runtime behind the JSON calls: one model, one conversation at a time.
//!
//! Every operation takes a JSON object and returns one; errors are one-line messages (and, for
//! a session whose identity does not match, the fields that differ). Nothing here panics on
//! bad input: the host may send anything.
//!
//! A chat turn is `turn` (render the messages with the chat template, tokenize, keep the
//! cached prefix, prefill the rest) and then `step` until it says `done`: each step samples a
//! token, streams its text and feeds it back, exactly as `spinkv.generation.TextStream` does
//! natively (stop on an end-of-turn token before feeding it; a reply that reaches max_tokens
//! ends without feeding its last token). `stop` ends a turn early (the cache returns to where
//! the turn started, as native interrupts do).
//!
//! A chat session slides as the terminal's does (when its context holds the head plus a page):
//! a full cache retires its oldest pages after the head, so replies do not stop at the
//! context. A `messages` turn renders the system prompt and the messages from the chat's
//! `context_start` on; when the cache must be built from nothing and that is longer than the
//! context minus room for the reply, it feeds only the newest whole turns that fit
//! ([`crate::window`]) and later turns go on from there. Only a message that does not fit the
//! context with the system prompt is refused.

use std::collections::HashMap;
use std::sync::Arc;

use serde_json::{json, Map, Value};
use spinkv_core::identity::session_identity;
use spinkv_core::in_memory::{hashed_model_file, model_hash_of_files};
use spinkv_core::persist::{
    mismatched_fields, read_session_bytes, restore_session_bytes, session_file_bytes,
};
use spinkv_core::prefix::{common_prefix_len, reuse_prefix};
use spinkv_core::{
    hex, state_digest, CacheStats, Digest, IdentityHashes, KvConfig, KvOptions, LayerStats, Model,
    OptionKind, OptionValue, Sampler, SamplerParams, Session, WeightBytes, PREFILL_BLOCK_TOKENS,
};
use tokenizers::Tokenizer;

use crate::host::now_ms;
use crate::template::Template;
use crate::window::{fitting_start, prompt_budget};

/// A failed call: the message, and for an identity mismatch the differing fields.
#[derive(Debug)]
pub(crate) struct CallError {
    pub message: String,
    pub kind: &'static str,
    pub fields: Vec<&'static str>,
}

impl CallError {
    fn new(kind: &'static str, message: impl Into<String>) -> CallError {
        CallError {
            message: message.into(),
            kind,
            fields: Vec::new(),
        }
    }
}

fn invalid(message: impl Into<String>) -> CallError {
    CallError::new("InvalidInputError", message)
}

fn model_error(err: spinkv_core::ModelError) -> CallError {
    use spinkv_core::ModelError as E;
    let kind = match &err {
        E::ContextOverflow { .. } => "ContextOverflowError",
        E::Kv(_) => "KvCacheError",
        E::InvalidSampling(_) | E::TokenOutOfRange { .. } | E::EmptyPrompt | E::Threads(_) => {
            "InvalidInputError"
        }
        E::UnsupportedArchitecture(_) | E::Unsupported(_) => "UnsupportedError",
        _ => "ModelFormatError",
    };
    CallError::new(kind, err.to_string())
}

pub(crate) type CallResult = Result<Value, CallError>;

/// Host-filled byte buffers, by handle (weights, tokenizer, session files).
#[derive(Default)]
pub(crate) struct Buffers {
    next: u32,
    map: HashMap<u32, WeightBytes>,
}

impl Buffers {
    pub(crate) fn create(&mut self, len: usize) -> Result<u32, CallError> {
        let bytes = WeightBytes::zeroed(len).map_err(model_error)?;
        self.next = self.next.wrapping_add(1).max(1);
        self.map.insert(self.next, bytes);
        Ok(self.next)
    }

    pub(crate) fn insert(&mut self, bytes: &[u8]) -> Result<u32, CallError> {
        let handle = self.create(bytes.len())?;
        if let Some(b) = self.map.get_mut(&handle) {
            b.as_mut_bytes().copy_from_slice(bytes);
        }
        Ok(handle)
    }

    pub(crate) fn get_mut(&mut self, handle: u32) -> Option<&mut WeightBytes> {
        self.map.get_mut(&handle)
    }

    pub(crate) fn remove(&mut self, handle: u32) -> Option<WeightBytes> {
        self.map.remove(&handle)
    }

    fn take(&mut self, handle: &Value, what: &str) -> Result<WeightBytes, CallError> {
        let h = handle
            .as_u64()
            .and_then(|h| u32::try_from(h).ok())
            .ok_or_else(|| invalid(format!("{what}: not a buffer handle")))?;
        self.remove(h)
            .ok_or_else(|| invalid(format!("{what}: no buffer {h}")))
    }

    fn read(&self, handle: &Value, what: &str) -> Result<&[u8], CallError> {
        let h = handle
            .as_u64()
            .and_then(|h| u32::try_from(h).ok())
            .ok_or_else(|| invalid(format!("{what}: not a buffer handle")))?;
        self.map
            .get(&h)
            .map(|b| b.as_bytes())
            .ok_or_else(|| invalid(format!("{what}: no buffer {h}")))
    }
}

/// Wasm linear memory as the design study's browser metrics count it.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Memory {
    pub pages: usize,
    pub peak_pages: usize,
    /// Calls during which memory grew (decode steps are one call each).
    pub growth_events: u64,
    /// The same since `mark` (the end of warm-up).
    pub growth_since_mark: u64,
    pub growth_during_decode: u64,
}

impl Memory {
    pub(crate) fn pages_now() -> usize {
        core::arch::wasm32::memory_size::<0>()
    }

    pub(crate) fn note(&mut self, before: usize, after: usize, decoding: bool) {
        if after > before {
            self.growth_events += 1;
            self.growth_since_mark += 1;
            if decoding {
                self.growth_during_decode += 1;
            }
        }
        self.pages = after;
        self.peak_pages = self.peak_pages.max(after);
    }

    fn to_json(self) -> Value {
        json!({
            "pages": self.pages,
            "bytes": self.pages as u64 * 65536,
            "peak_pages": self.peak_pages,
            "growth_events": self.growth_events,
            "growth_since_mark": self.growth_since_mark,
            "growth_during_decode": self.growth_during_decode,
        })
    }
}

/// Free heap kept behind a session's reserved cache pages. What else a conversation
/// allocates grows with it — the token list, the prompt of each turn and its JSON reply,
/// prefill scratch, page tables — and is mostly freed again, so once the heap has room for the
/// largest of these a long chat grows wasm memory no more: grown up front, in one step.
const HEADROOM_BYTES: usize = 32 << 20;

/// Makes sure the heap holds [`HEADROOM_BYTES`] free: allocated and freed at once, the block
/// returns to the allocator (wasm memory never shrinks), where later allocations find it.
fn keep_headroom() {
    let mut block: Vec<u8> = Vec::new();
    // Refused on a nearly full 4 GiB: then the conversation grows memory when it must.
    let _ = block.try_reserve_exact(HEADROOM_BYTES);
}

struct Loaded {
    name: String,
    model: Arc<Model>,
    model_hash: Digest,
    tokenizer: Tokenizer,
    template: Template,
    eos_ids: Vec<u32>,
    hashes: IdentityHashes,
    load_ms: f64,
    hash_ms: f64,
}

/// Incremental detokenization (tokenizers' DecodeStream state, owned).
#[derive(Default)]
struct StreamState {
    ids: Vec<u32>,
    prefix: String,
    prefix_index: usize,
}

struct Turn {
    sampler: Sampler,
    max_tokens: usize,
    generated: Vec<u32>,
    text: String,
    stream: StreamState,
    started_ms: f64,
    tokenize_ms: f64,
    first_token_ms: Option<f64>,
    prompt_tokens: usize,
    cached_tokens: usize,
    /// Where a `messages` turn's rendering started (the chat's next `context_start`).
    context_start: Option<usize>,
}

struct Chat {
    session: Session,
    kv: Value,
    turn: Option<Turn>,
    last_turn: Value,
    /// Index, among the messages after the system prompt, of the first one turns render (0
    /// unless a sliding chat rebuilt its cache from a long conversation).
    context_start: usize,
    /// Set by a restore for the next turn: kept unless that prompt outgrows the whole context.
    start_chosen: bool,
}

/// Whether the cache keeps nothing of use for `prompt`: it is empty, the prompt leaves it
/// before its retired tokens (the cut then keeps only the head), or what the prompt does not
/// share with it is more than `cap` tokens (a changed system prompt) — the rule of
/// `spinkv.api.ChatSession._rebuilds`.
fn rebuilds(session: &Session, prompt: &[u32], cap: usize) -> bool {
    if session.is_empty() {
        return true;
    }
    let (retired, common) = (
        session.retired(),
        common_prefix_len(session.tokens(), prompt),
    );
    (retired > 0 && common < retired) || prompt.len() - common > cap
}

/// A `messages` turn's start (see the module) and prompt tokens.
fn messages_prompt(
    l: &Loaded,
    chat: &Chat,
    messages: &Value,
    max_tokens: usize,
) -> Result<(usize, Vec<u32>), CallError> {
    let list = messages
        .as_array()
        .ok_or_else(|| invalid("messages must be a list"))?;
    fn role(m: &Value) -> &str {
        m.get("role").and_then(Value::as_str).unwrap_or("")
    }
    let head = list.iter().take_while(|m| role(m) == "system").count();
    let (system, rest) = list.split_at(head.min(list.len()));
    let render_from = |start: usize| -> Result<Vec<u32>, CallError> {
        let mut fed = system.to_vec();
        fed.extend_from_slice(rest.get(start..).unwrap_or(&[]));
        let text = l
            .template
            .render(&Value::Array(fed), true)
            .map_err(invalid)?;
        Engine::encode(l, &text)
    };
    let last = rest.len().saturating_sub(1);
    let first = if chat.context_start <= last {
        chat.context_start
    } else {
        0
    };
    let prompt = render_from(first)?;
    let session = &chat.session;
    if !session.sliding() || rest.is_empty() {
        return Ok((first, prompt));
    }
    let limit = session.max_context();
    let budget = prompt_budget(limit, max_tokens);
    let cap = if chat.start_chosen { limit } else { budget };
    let (start, prompt) = if prompt.len() > cap && rebuilds(session, &prompt, cap) {
        let roles: Vec<&str> = rest.iter().map(role).collect();
        let start = fitting_start(&roles, first, budget, |s| {
            render_from(s).ok().map(|ids| ids.len())
        });
        (start, render_from(start)?)
    } else {
        (first, prompt)
    };
    if prompt.len() > limit {
        // Earlier turns slide out of the window; the new message and the system prompt, which
        // never slides out, must fit.
        let alone = if start == last {
            prompt.len()
        } else {
            render_from(last)?.len()
        };
        if alone > limit {
            let what = if system.is_empty() {
                "the message is"
            } else {
                "the system prompt and the message are"
            };
            return Err(CallError::new(
                "ContextOverflowError",
                format!("{what} {alone} tokens but the context holds {limit} tokens"),
            ));
        }
    }
    Ok((start, prompt))
}

#[derive(Default)]
pub(crate) struct Engine {
    loaded: Option<Loaded>,
    chat: Option<Chat>,
    pub memory: Memory,
}

fn field<'a>(args: &'a Value, key: &str) -> Option<&'a Value> {
    args.get(key).filter(|v| !v.is_null())
}

fn str_field<'a>(args: &'a Value, key: &str) -> Result<Option<&'a str>, CallError> {
    match field(args, key) {
        None => Ok(None),
        Some(v) => v
            .as_str()
            .map(Some)
            .ok_or_else(|| invalid(format!("{key} must be a string"))),
    }
}

fn count_field(args: &Value, key: &str) -> Result<Option<usize>, CallError> {
    match field(args, key) {
        None => Ok(None),
        Some(v) => v
            .as_u64()
            .and_then(|n| usize::try_from(n).ok())
            .map(Some)
            .ok_or_else(|| invalid(format!("{key} must be a count >= 0, got {v}"))),
    }
}

fn token_list(value: &Value, what: &str) -> Result<Vec<u32>, CallError> {
    value
        .as_array()
        .ok_or_else(|| invalid(format!("{what} must be a list of token ids")))?
        .iter()
        .map(|t| {
            t.as_u64()
                .and_then(|t| u32::try_from(t).ok())
                .ok_or_else(|| invalid(format!("{what}: {t} is not a token id")))
        })
        .collect()
}

/// `kv` as the Python API takes it: a preset name, a spec string (`turbo:window=0`), or an
/// object of option keys.
/// The cache policy of a `kv` argument on `model` (its context and its family's defaults).
fn kv_config(kv: Option<&Value>, model: &Model) -> Result<KvConfig, CallError> {
    let kv_error = |e: spinkv_core::KvError| CallError::new("KvCacheError", e.to_string());
    let options = match kv {
        None => KvOptions::default(),
        Some(Value::String(spec)) => KvOptions::parse_spec(spec).map_err(kv_error)?.0,
        Some(Value::Object(map)) => {
            let mut options = KvOptions::default();
            for (key, value) in map.iter().filter(|(_, v)| !v.is_null()) {
                let kind = KvOptions::kind_of(key).map_err(kv_error)?;
                let bad = || invalid(format!("kv option {key} cannot be {value}"));
                let value = match kind {
                    OptionKind::Text => OptionValue::Text(value.as_str().ok_or_else(bad)?.into()),
                    OptionKind::Bits => OptionValue::Bits(value.as_f64().ok_or_else(bad)? as f32),
                    OptionKind::Count => OptionValue::Count(value.as_i64().ok_or_else(bad)?),
                    OptionKind::Seed => OptionValue::Seed(value.as_u64().ok_or_else(bad)?),
                    OptionKind::Fraction => {
                        OptionValue::Fraction(value.as_f64().ok_or_else(bad)? as f32)
                    }
                };
                options.set(key, value).map_err(kv_error)?;
            }
            options
        }
        Some(other) => {
            return Err(invalid(format!(
                "kv must be a preset or an object, got {other}"
            )))
        }
    };
    let config = model.config();
    KvConfig::for_model(
        &options,
        config.max_position_embeddings,
        config.kv_defaults(),
    )
    .map_err(kv_error)
}

fn sampler_params(args: Option<&Value>) -> Result<SamplerParams, CallError> {
    let mut p = SamplerParams::default();
    let Some(args) = args else { return Ok(p) };
    if !args.is_object() {
        return Err(invalid("sampling must be an object"));
    }
    let num = |key: &str| -> Result<Option<f64>, CallError> {
        match field(args, key) {
            None => Ok(None),
            Some(v) => v
                .as_f64()
                .map(Some)
                .ok_or_else(|| invalid(format!("sampling {key} must be a number, got {v}"))),
        }
    };
    if let Some(v) = num("temperature")? {
        p.temperature = v as f32;
    }
    if let Some(v) = num("top_p")? {
        p.top_p = v as f32;
    }
    if let Some(v) = num("min_p")? {
        p.min_p = v as f32;
    }
    if let Some(v) = num("repetition_penalty")? {
        p.repetition_penalty = v as f32;
    }
    if let Some(v) = count_field(args, "top_k")? {
        p.top_k = v;
    }
    if let Some(v) = count_field(args, "repeat_last_n")? {
        p.repeat_last_n = v;
    }
    if let Some(v) = field(args, "seed") {
        p.seed =
            Some(v.as_u64().ok_or_else(|| {
                invalid(format!("sampling seed must be an integer >= 0, got {v}"))
            })?);
    }
    p.validate().map_err(model_error)?;
    Ok(p)
}

fn layer_json(s: &LayerStats) -> Value {
    json!({
        "tokens": s.tokens, "compressed_tokens": s.compressed_tokens,
        "fp16_tokens": s.fp16_tokens, "recycled_tokens": s.recycled_tokens,
        "window": s.window, "pages_used": s.pages_used,
        "k_payload_bytes": s.k_payload_bytes, "v_payload_bytes": s.v_payload_bytes,
        "norm_bytes": s.norm_bytes, "header_bytes": s.header_bytes,
        "padding_bytes": s.padding_bytes, "window_bytes": s.window_bytes,
        "allocated_bytes": s.allocated_bytes, "bits_per_channel": s.bits_per_channel,
        "compression_vs_fp16": s.compression_vs_fp16,
    })
}

fn stats_json(s: &CacheStats) -> Value {
    json!({
        "codec": s.codec.name(),
        "tokens": s.tokens,
        "pages_allocated": s.pages_allocated,
        "pages_free": s.pages_free,
        "pool_bytes": s.pool_bytes,
        "fp16_page_bytes": s.fp16_page_bytes,
        "sealed_page_bytes": s.sealed_page_bytes,
        "scratch_bytes": s.scratch_bytes,
        "fp16_equivalent_bytes": s.fp16_equivalent_bytes,
        "total": layer_json(&s.total),
        "layers": s.layers.iter().map(layer_json).collect::<Vec<_>>(),
        "problems": s.accounting_problems(),
    })
}

fn timings_json(session: &Session) -> Value {
    let t = session.timings();
    let ms = |ns: u64| ns as f64 / 1e6;
    json!({
        "prefill_tokens": t.prefill_tokens, "prefill_ms": ms(t.prefill_ns),
        "decode_tokens": t.decode_tokens, "decode_ms": ms(t.decode_ns),
        "samples": t.samples, "sample_ms": ms(t.sample_ns),
        "attention_ms": ms(t.attention_ns), "matmul_ms": ms(t.matmul_ns),
        "other_ms": ms(t.other_ns),
        "prefill_tok_per_s": t.prefill_tokens_per_s(), "decode_tok_per_s": t.decode_tokens_per_s(),
    })
}

impl Engine {
    pub(crate) fn call(&mut self, op: &str, args: &Value, buffers: &mut Buffers) -> CallResult {
        match op {
            "info" => Ok(self.info()),
            "load" => self.load(args, buffers),
            "session" => self.new_session(args),
            "render" => self.render(args),
            "tokenize" => self.tokenize(args),
            "detokenize" => self.detokenize(args),
            "prefill" => self.prefill(args),
            "turn" => self.turn(args),
            "step" => self.step(),
            "stop" => self.finish("interrupted"),
            "stats" => self.stats(),
            "mark" => {
                self.memory.growth_since_mark = 0;
                Ok(self.memory.to_json())
            }
            "identity" => self.identity(),
            "save" => self.save(args, buffers),
            "read_session" => self.read_session(args, buffers),
            "restore" => self.restore(args, buffers),
            "bench" => self.bench(args),
            // Step by step, for a host that times each call (`spinkv bench --isa simd128`).
            "decode" => self.decode(args),
            "greedy" => self.greedy(),
            "checkpoint" => self.idle_session().map(|s| {
                s.checkpoint();
                json!({ "tokens": s.len() })
            }),
            // Back to the checkpoint, which stays (the bench returns to it every repetition).
            "rollback" => self.idle_session().and_then(|s| match s.rollback_turn() {
                true => {
                    s.checkpoint();
                    Ok(json!({ "tokens": s.len() }))
                }
                false => Err(invalid("no checkpoint to go back to")),
            }),
            "timings" => self.idle_session().map(|s| timings_json(s)),
            "reset_timings" => self.idle_session().map(|s| {
                s.reset_timings();
                json!({})
            }),
            "cache_stats" => self.idle_session().map(|s| stats_json(&s.cache_stats())),
            other => Err(invalid(format!("unknown call {other:?}"))),
        }
    }

    /// True while a turn is streaming (its steps count as decode for the memory metrics).
    pub(crate) fn decoding(&self) -> bool {
        self.chat.as_ref().is_some_and(|c| c.turn.is_some())
    }

    fn info(&self) -> Value {
        json!({
            "runtime_build": spinkv_core::runtime_build(),
            "isa": spinkv_kernels::active_isa().name(),
            "threads": spinkv_core::threads(),
            "presets": spinkv_core::PRESETS,
            "default_preset": spinkv_core::DEFAULT_PRESET,
            "prefill_block_tokens": PREFILL_BLOCK_TOKENS,
            "memory": self.memory.to_json(),
        })
    }

    fn loaded(&self) -> Result<&Loaded, CallError> {
        self.loaded
            .as_ref()
            .ok_or_else(|| invalid("no model loaded: call load first"))
    }

    fn chat(&mut self) -> Result<&mut Chat, CallError> {
        self.chat
            .as_mut()
            .ok_or_else(|| invalid("no session: call session first"))
    }

    /// `{name, files: {name: buffer}, chat_template: {source, bos_token, eos_token},
    /// eos_token_ids, identity: {tokenizer_hash, chat_template_hash}}`. The buffers are taken
    /// (weights are used in place); config.json, tokenizer.json and the safetensors are needed.
    fn load(&mut self, args: &Value, buffers: &mut Buffers) -> CallResult {
        let started = now_ms();
        let name = str_field(args, "name")?.unwrap_or("model").to_string();
        let files = field(args, "files")
            .and_then(|f| f.as_object())
            .ok_or_else(|| invalid("load needs files: {name: buffer}"))?;
        let mut taken: Vec<(String, WeightBytes)> = Vec::new();
        for (file, handle) in files {
            taken.push((file.clone(), buffers.take(handle, file)?));
        }
        taken.sort_by(|a, b| a.0.cmp(&b.0));
        let get = |n: &str| {
            taken
                .iter()
                .find(|(f, _)| f == n)
                .map(|(_, b)| b.as_bytes())
        };
        let missing = |n: &str| CallError::new("ModelNotFoundError", format!("{name} has no {n}"));

        let hash_started = now_ms();
        let hashed: Vec<(&str, &[u8])> = taken
            .iter()
            .filter(|(f, _)| hashed_model_file(f))
            .map(|(f, b)| (f.as_str(), b.as_bytes()))
            .collect();
        let model_hash = model_hash_of_files(&hashed).map_err(|e| invalid(e.0))?;
        let hash_ms = now_ms() - hash_started;

        let config = std::str::from_utf8(get("config.json").ok_or_else(|| missing("config.json"))?)
            .map_err(|_| {
                CallError::new(
                    "ModelFormatError",
                    format!("{name}/config.json is not UTF-8"),
                )
            })?
            .to_string();
        let tokenizer =
            Tokenizer::from_bytes(get("tokenizer.json").ok_or_else(|| missing("tokenizer.json"))?)
                .map_err(|e| {
                    CallError::new(
                        "ModelFormatError",
                        format!("cannot load {name}/tokenizer.json: {e}"),
                    )
                })?;
        let chat = field(args, "chat_template").cloned().unwrap_or(Value::Null);
        let source = str_field(&chat, "source")?
            .ok_or_else(|| invalid("load needs chat_template.source"))?;
        let template = Template::new(
            source,
            str_field(&chat, "bos_token")?.unwrap_or(""),
            str_field(&chat, "eos_token")?.unwrap_or(""),
        )
        .map_err(|e| CallError::new("ModelFormatError", e))?;
        let eos_ids = token_list(
            field(args, "eos_token_ids").unwrap_or(&Value::Array(Vec::new())),
            "eos_token_ids",
        )?;
        let mut hashes = IdentityHashes::default();
        if let Some(identity) = field(args, "identity").and_then(|v| v.as_object()) {
            for (key, value) in identity {
                let text = value
                    .as_str()
                    .ok_or_else(|| invalid(format!("identity {key} must be hex text")))?;
                hashes.set_hex(key, text).map_err(|e| invalid(e.0))?;
            }
        }
        let weights: Vec<(String, WeightBytes)> = taken
            .into_iter()
            .filter(|(f, _)| f.ends_with(".safetensors"))
            .collect();
        // The session holds the old model: drop both before the new weights are checked, so
        // two models never sit in memory at once.
        self.chat = None;
        self.loaded = None;
        let model = Model::from_bytes(&name, &config, weights).map_err(model_error)?;
        let vocab = model.config().vocab_size;
        if tokenizer.get_vocab_size(true) > vocab {
            return Err(CallError::new(
                "ModelFormatError",
                format!(
                    "tokenizer has {} tokens but config.json vocab_size is {vocab} (tokenizer and embedding do not match)",
                    tokenizer.get_vocab_size(true)
                ),
            ));
        }
        let load_ms = now_ms() - started;
        self.loaded = Some(Loaded {
            name,
            model,
            model_hash,
            tokenizer,
            template,
            eos_ids,
            hashes,
            load_ms,
            hash_ms,
        });
        let l = self.loaded()?;
        let c = l.model.config();
        Ok(json!({
            "name": l.name,
            "model_hash": hex(&l.model_hash),
            "load_ms": l.load_ms,
            "hash_ms": l.hash_ms,
            "file_bytes": l.model.file_bytes(),
            "dtype": format!("{:?}", l.model.dtype()).to_lowercase(),
            "n_layers": c.num_hidden_layers,
            "hidden_size": c.hidden_size,
            "n_heads": c.num_attention_heads,
            "n_kv_heads": c.num_key_value_heads,
            "head_dim": c.head_dim,
            "vocab_size": c.vocab_size,
            "max_context": c.max_position_embeddings,
            "memory": self.memory.to_json(),
        }))
    }

    /// A fresh conversation: `{kv, reserve}` (`reserve`: tokens of cache pages allocated up
    /// front; default the whole context, so a long chat does not grow memory).
    fn new_session(&mut self, args: &Value) -> CallResult {
        let model = Arc::clone(&self.loaded()?.model);
        let config = kv_config(field(args, "kv"), &model)?;
        // The old session's cache goes before the new one is reserved.
        self.chat = None;
        let mut session = Session::new(model, config).map_err(model_error)?;
        // As the terminal's chat: sliding unless refused, or the context is too short for it.
        let slide = match field(args, "slide") {
            None => true,
            Some(v) => v
                .as_bool()
                .ok_or_else(|| invalid(format!("slide must be true or false, got {v}")))?,
        };
        let sliding = slide && session.set_sliding(true).is_ok();
        let reserve = count_field(args, "reserve")?.unwrap_or(session.max_context());
        session.reserve(reserve.min(session.max_context()));
        keep_headroom();
        let max_context = session.max_context();
        let config = session.cache().config().clone();
        self.chat = Some(Chat {
            session,
            kv: field(args, "kv").cloned().unwrap_or(Value::Null),
            turn: None,
            last_turn: Value::Null,
            context_start: 0,
            start_chosen: false,
        });
        Ok(json!({
            "kv": self.chat()?.kv.clone(),
            "codec": config.codec.name(),
            "max_context": max_context,
            "sliding": sliding,
            "reserved_tokens": reserve.min(max_context),
        }))
    }

    fn render(&self, args: &Value) -> CallResult {
        let l = self.loaded()?;
        let messages = field(args, "messages").ok_or_else(|| invalid("render needs messages"))?;
        let add = field(args, "add_generation_prompt")
            .and_then(|v| v.as_bool())
            .unwrap_or(true);
        let text = l.template.render(messages, add).map_err(invalid)?;
        Ok(json!({ "text": text }))
    }

    fn encode(l: &Loaded, text: &str) -> Result<Vec<u32>, CallError> {
        l.tokenizer
            .encode(text, false)
            .map(|e| e.get_ids().to_vec())
            .map_err(|e| invalid(format!("cannot tokenize: {e}")))
    }

    fn tokenize(&self, args: &Value) -> CallResult {
        let l = self.loaded()?;
        let text = str_field(args, "text")?.ok_or_else(|| invalid("tokenize needs text"))?;
        Ok(json!({ "ids": Self::encode(l, text)? }))
    }

    fn detokenize(&self, args: &Value) -> CallResult {
        let l = self.loaded()?;
        let ids = token_list(field(args, "ids").unwrap_or(&Value::Null), "ids")?;
        let vocab = l.model.config().vocab_size;
        if let Some(bad) = ids.iter().find(|&&t| t as usize >= vocab) {
            return Err(invalid(format!(
                "token id {bad} is outside the vocabulary (0..{})",
                vocab - 1
            )));
        }
        let text = l
            .tokenizer
            .decode(&ids, true)
            .map_err(|e| invalid(format!("cannot decode: {e}")))?;
        Ok(json!({ "text": text }))
    }

    /// Raw tokens into the session (tests and benchmarks): `{tokens}`.
    /// The session while no reply streams (the step-by-step calls work on it directly).
    fn idle_session(&mut self) -> Result<&mut Session, CallError> {
        let chat = self.chat()?;
        if chat.turn.is_some() {
            return Err(invalid("a reply is streaming: stop it first"));
        }
        Ok(&mut chat.session)
    }

    /// Feeds one token: `{token}`.
    fn decode(&mut self, args: &Value) -> CallResult {
        let token = field(args, "token")
            .and_then(|t| t.as_u64())
            .and_then(|t| u32::try_from(t).ok())
            .ok_or_else(|| invalid("decode needs token: a token id"))?;
        let session = self.idle_session()?;
        session.decode(token).map_err(model_error)?;
        Ok(json!({ "tokens": session.len() }))
    }

    /// The greedy next token after the last one fed (sampled, so timed as native sampling is).
    fn greedy(&mut self) -> CallResult {
        let session = self.idle_session()?;
        let mut sampler = Sampler::new(SamplerParams::default()).map_err(model_error)?;
        let token = session.sample(&mut sampler).map_err(model_error)?;
        Ok(json!({ "token": token }))
    }

    fn prefill(&mut self, args: &Value) -> CallResult {
        let tokens = token_list(field(args, "tokens").unwrap_or(&Value::Null), "tokens")?;
        let chat = self.chat()?;
        if chat.turn.is_some() {
            return Err(invalid("a reply is streaming: stop it first"));
        }
        chat.session.prefill(&tokens, false).map_err(model_error)?;
        Ok(json!({ "tokens": chat.session.len() }))
    }

    /// Starts a reply: `{messages | prompt_ids | append_ids, sampling, max_tokens}`. A
    /// `messages` turn of a sliding chat renders from its `context_start` (see the module).
    fn turn(&mut self, args: &Value) -> CallResult {
        let started = now_ms();
        let l = self
            .loaded
            .as_ref()
            .ok_or_else(|| invalid("no model loaded: call load first"))?;
        let max_tokens = count_field(args, "max_tokens")?.unwrap_or(512);
        let (prompt_ids, context_start) = match (field(args, "prompt_ids"), field(args, "messages"))
        {
            (Some(ids), _) => (token_list(ids, "prompt_ids")?, None),
            (None, Some(messages)) => match self.chat.as_ref() {
                Some(chat) => {
                    let (start, ids) = messages_prompt(l, chat, messages, max_tokens.max(1))?;
                    (ids, Some(start))
                }
                None => return Err(invalid("no session: call session first")),
            },
            (None, None) => match (field(args, "append_ids"), self.chat.as_ref()) {
                // The conversation so far plus these tokens (a long chat driven by tokens).
                (Some(ids), Some(chat)) => {
                    let mut all = chat.session.tokens().to_vec();
                    all.extend(token_list(ids, "append_ids")?);
                    (all, None)
                }
                _ => return Err(invalid("turn needs messages, prompt_ids or append_ids")),
            },
        };
        let tokenize_ms = now_ms() - started;
        if prompt_ids.is_empty() {
            return Err(invalid("the prompt is empty after tokenization"));
        }
        let sampler =
            Sampler::new(sampler_params(field(args, "sampling"))?).map_err(model_error)?;
        if max_tokens < 1 {
            return Err(invalid("invalid max_tokens 0: must be >= 1"));
        }
        let chat = self
            .chat
            .as_mut()
            .ok_or_else(|| invalid("no session: call session first"))?;
        if chat.turn.is_some() {
            return Err(invalid("a reply is already streaming: stop it first"));
        }
        let max_context = chat.session.max_context();
        // A sliding session retires old pages instead (a `messages` turn refused a message too
        // long on its own above; raw token prompts slide through, as native ones do).
        if !chat.session.sliding() && prompt_ids.len() > max_context {
            return Err(CallError::new(
                "ContextOverflowError",
                format!(
                    "the prompt is {} tokens but the context holds {max_context} tokens",
                    prompt_ids.len()
                ),
            ));
        }
        let session = &mut chat.session;
        session.reset_timings();
        let fed = reuse_prefix(session, &prompt_ids).map_err(|e| invalid(e.0))?;
        // Of the prompt tokens the session holds, those that slid out were not read from the
        // cache: only the cache's own count was.
        let cached = session.cache_len();
        session.checkpoint();
        for block in prompt_ids[fed..].chunks(PREFILL_BLOCK_TOKENS) {
            if let Err(err) = session.prefill(block, false) {
                session.rollback_turn();
                return Err(model_error(err));
            }
        }
        chat.turn = Some(Turn {
            sampler,
            max_tokens,
            generated: Vec::new(),
            text: String::new(),
            stream: StreamState::default(),
            started_ms: started,
            tokenize_ms,
            first_token_ms: None,
            prompt_tokens: prompt_ids.len(),
            cached_tokens: cached,
            context_start,
        });
        Ok(json!({
            "prompt_tokens": prompt_ids.len(),
            "cached_tokens": cached,
            "context_start": context_start.unwrap_or(chat.context_start),
            "prompt_ids": prompt_ids,
        }))
    }

    /// One token of the streaming reply: `{token, piece, done, reason?}`.
    fn step(&mut self) -> CallResult {
        let Engine { loaded, chat, .. } = &mut *self;
        let l = loaded.as_ref().ok_or_else(|| invalid("no model loaded"))?;
        let chat = chat.as_mut().ok_or_else(|| invalid("no session"))?;
        let turn = chat
            .turn
            .as_mut()
            .ok_or_else(|| invalid("no reply is streaming: call turn first"))?;
        let session = &mut chat.session;
        let token = match session.sample(&mut turn.sampler) {
            Ok(t) => t,
            Err(e) => return Err(model_error(e)),
        };
        if turn.first_token_ms.is_none() {
            turn.first_token_ms = Some(now_ms() - turn.started_ms);
        }
        if l.eos_ids.contains(&token) {
            return self.finish_with("stop", Some(token));
        }
        turn.generated.push(token);
        let piece = tokenizers::tokenizer::step_decode_stream(
            &*l.tokenizer,
            vec![token],
            true,
            &mut turn.stream.ids,
            &mut turn.stream.prefix,
            &mut turn.stream.prefix_index,
        )
        .map_err(|e| invalid(format!("cannot decode token id {token}: {e}")))?
        .unwrap_or_default();
        turn.text.push_str(&piece);
        if turn.generated.len() >= turn.max_tokens {
            return self.finish_with_piece("length", token, piece);
        }
        if !session.sliding() && session.len() >= session.max_context() {
            return self.finish_with_piece("context", token, piece);
        }
        if let Err(err) = session.decode(token) {
            let _ = self.finish("error");
            return Err(model_error(err));
        }
        Ok(json!({ "token": token, "piece": piece, "done": false }))
    }

    fn finish_with_piece(&mut self, reason: &str, token: u32, piece: String) -> CallResult {
        let mut out = self.finish(reason)?;
        out["token"] = json!(token);
        let tail = out["piece"].as_str().unwrap_or("").to_string();
        out["piece"] = json!(piece + &tail);
        Ok(out)
    }

    fn finish_with(&mut self, reason: &str, token: Option<u32>) -> CallResult {
        let mut out = self.finish(reason)?;
        out["stop_token"] = json!(token);
        Ok(out)
    }

    /// Ends the reply: kept (`stop`, `length`, `context`) or rolled back (`interrupted`,
    /// `error`), as native turns are. Returns the tail of the text and the turn's figures.
    fn finish(&mut self, reason: &str) -> CallResult {
        let Engine { loaded, chat, .. } = &mut *self;
        let l = loaded.as_ref().ok_or_else(|| invalid("no model loaded"))?;
        let chat = chat.as_mut().ok_or_else(|| invalid("no session"))?;
        let Some(mut turn) = chat.turn.take() else {
            return Err(invalid("no reply is streaming"));
        };
        let full = l
            .tokenizer
            .decode(&turn.generated, true)
            .unwrap_or_default();
        let tail = full
            .strip_prefix(turn.text.as_str())
            .unwrap_or_default()
            .to_string();
        turn.text.push_str(&tail);
        match reason {
            "interrupted" | "error" => {
                chat.session.rollback_turn();
            }
            _ => {
                chat.session.commit_turn();
                if let Some(start) = turn.context_start {
                    chat.context_start = start;
                    chat.start_chosen = false;
                }
            }
        }
        let record = json!({
            "reason": reason,
            "text": turn.text,
            "token_ids": turn.generated,
            "prompt_tokens": turn.prompt_tokens,
            "cached_tokens": turn.cached_tokens,
            "context_start": chat.context_start,
            "completion_tokens": turn.generated.len(),
            "tokenize_ms": turn.tokenize_ms,
            "first_token_ms": turn.first_token_ms,
            "total_ms": now_ms() - turn.started_ms,
            "timings": timings_json(&chat.session),
        });
        chat.last_turn = record.clone();
        Ok(json!({ "done": true, "reason": reason, "piece": tail, "turn": record }))
    }

    fn stats(&self) -> CallResult {
        let l = self.loaded()?;
        let mut out = json!({
            "model": {"name": l.name, "load_ms": l.load_ms, "hash_ms": l.hash_ms,
                      "file_bytes": l.model.file_bytes()},
            "isa": spinkv_kernels::active_isa().name(),
            "threads": 1,
            "memory": self.memory.to_json(),
        });
        if let Some(chat) = &self.chat {
            out["session"] = json!({
                "tokens": chat.session.len(),
                "cache_len": chat.session.cache_len(),
                "max_context": chat.session.max_context(),
                "sliding": chat.session.sliding(),
                "retired_tokens": chat.session.retired(),
                "context_start": chat.context_start,
                "kv": chat.kv,
                "streaming": chat.turn.is_some(),
            });
            out["cache"] = stats_json(&chat.session.cache_stats());
            out["timings"] = timings_json(&chat.session);
            out["last_turn"] = chat.last_turn.clone();
        }
        Ok(out)
    }

    fn identity(&mut self) -> CallResult {
        let (hash, hashes) = {
            let l = self.loaded()?;
            (l.model_hash, l.hashes)
        };
        let chat = self.chat()?;
        let identity = session_identity(&chat.session, hash, &hashes);
        let fields: Map<String, Value> = identity
            .fields()
            .into_iter()
            .map(|(k, v)| (k.to_string(), Value::String(v)))
            .collect();
        Ok(json!({
            "fields": fields,
            "state_digest": hex(&state_digest(&chat.session)),
            "tokens": chat.session.tokens(),
        }))
    }

    /// The session file for `{transcript}` (JSON text), into a new buffer.
    fn save(&mut self, args: &Value, buffers: &mut Buffers) -> CallResult {
        let mut transcript = str_field(args, "transcript")?.unwrap_or("{}").to_string();
        let (hash, hashes) = {
            let l = self.loaded()?;
            (l.model_hash, l.hashes)
        };
        let chat = self.chat()?;
        if chat.turn.is_some() {
            return Err(invalid("a reply is streaming: save after it ends"));
        }
        // A chat transcript records where the cache's rendering starts, as the CLI's does.
        if let Ok(Value::Object(mut record)) = serde_json::from_str::<Value>(&transcript) {
            if record.get("format").and_then(Value::as_str) == Some("spinkv-transcript") {
                record.insert("context_start".into(), json!(chat.context_start));
                transcript = Value::Object(record).to_string();
            }
        }
        let bytes = session_file_bytes(&chat.session, hash, &hashes, &transcript);
        let digest = hex(&state_digest(&chat.session));
        let tokens = chat.session.len();
        let handle = buffers.insert(&bytes)?;
        Ok(
            json!({ "buffer": handle, "bytes": bytes.len(), "state_digest": digest, "tokens": tokens }),
        )
    }

    fn read_session(&self, args: &Value, buffers: &mut Buffers) -> CallResult {
        let buffer = field(args, "buffer").ok_or_else(|| invalid("read_session needs buffer"))?;
        let bytes = buffers.read(buffer, "session")?;
        let origin = str_field(args, "origin")?.unwrap_or("session file");
        let (header, intact) = read_session_bytes(bytes, true, origin)
            .map_err(|e| CallError::new("SessionFileError", e.to_string()))?;
        let fields: Map<String, Value> = header
            .identity
            .fields()
            .into_iter()
            .map(|(k, v)| (k.to_string(), Value::String(v)))
            .collect();
        let differ = match (&self.loaded, &self.chat) {
            (Some(l), Some(chat)) => {
                let mine = session_identity(&chat.session, l.model_hash, &l.hashes);
                Some(mine.mismatches(&header.identity))
            }
            _ => None,
        };
        Ok(json!({
            "version": header.version,
            "identity": fields,
            "transcript": header.transcript,
            "file_bytes": header.file_bytes,
            "intact": intact,
            "differs_from_session": differ,
        }))
    }

    /// Restores the session file in `{buffer}` into the current session; returns the
    /// transcript. An identity mismatch names the fields; the session is untouched on error.
    fn restore(&mut self, args: &Value, buffers: &mut Buffers) -> CallResult {
        let buffer = field(args, "buffer").ok_or_else(|| invalid("restore needs buffer"))?;
        let origin = str_field(args, "origin")?
            .unwrap_or("session file")
            .to_string();
        let (hash, hashes) = {
            let l = self.loaded()?;
            (l.model_hash, l.hashes)
        };
        let bytes = buffers.read(buffer, "session")?.to_vec();
        let chat = self.chat()?;
        if chat.turn.is_some() {
            return Err(invalid("a reply is streaming: stop it first"));
        }
        let transcript = restore_session_bytes(&mut chat.session, hash, &hashes, &bytes, &origin)
            .map_err(|e| {
            let fields = mismatched_fields(&e)
                .map(|f| f.to_vec())
                .unwrap_or_default();
            let kind = if fields.is_empty() {
                "SessionFileError"
            } else {
                "IdentityMismatchError"
            };
            CallError {
                message: e.to_string(),
                kind,
                fields,
            }
        })?;
        // A reused cache goes on from the message it was fed from.
        chat.context_start = serde_json::from_str::<Value>(&transcript)
            .ok()
            .and_then(|t| t.get("context_start").and_then(Value::as_u64))
            .and_then(|n| usize::try_from(n).ok())
            .unwrap_or(0);
        chat.start_chosen = true;
        let max_context = chat.session.max_context();
        chat.session.reserve(max_context);
        keep_headroom();
        Ok(json!({
            "transcript": transcript,
            "tokens": chat.session.len(),
            "state_digest": hex(&state_digest(&chat.session)),
        }))
    }

    /// Whole-model decode speed: for each depth, a fresh session is filled to that depth and
    /// `n` greedy tokens are decoded (median of `repeats` runs): `{kv, depths, n, repeats}`.
    fn bench(&mut self, args: &Value) -> CallResult {
        let l = self.loaded()?;
        let model = Arc::clone(&l.model);
        let vocab = model.config().vocab_size as u32;
        let depths = match field(args, "depths") {
            Some(v) => token_list(v, "depths")?,
            None => vec![512],
        };
        let n = count_field(args, "n")?.unwrap_or(32).max(1);
        let repeats = count_field(args, "repeats")?.unwrap_or(1).max(1);
        let config = kv_config(field(args, "kv"), &model)?;
        let mut rows = Vec::new();
        for depth in depths {
            let depth = depth as usize;
            let mut decode = Vec::new();
            let mut fill = 0.0;
            for _ in 0..repeats {
                let mut session =
                    Session::new(Arc::clone(&model), config.clone()).map_err(model_error)?;
                session.reserve(depth + n + 1);
                let tokens: Vec<u32> = (0..depth.max(1) as u32)
                    .map(|i| (i.wrapping_mul(7919).wrapping_add(13)) % vocab)
                    .collect();
                for block in tokens.chunks(PREFILL_BLOCK_TOKENS) {
                    session.prefill(block, false).map_err(model_error)?;
                }
                fill = session.timings().prefill_tokens_per_s();
                session.reset_timings();
                let mut sampler = Sampler::new(SamplerParams::default()).map_err(model_error)?;
                for _ in 0..n {
                    let token = session.sample(&mut sampler).map_err(model_error)?;
                    session.decode(token).map_err(model_error)?;
                }
                decode.push(session.timings().decode_tokens_per_s());
            }
            decode.sort_by(|a, b| a.total_cmp(b));
            rows.push(json!({
                "depth": depth,
                "n": n,
                "fill_tok_per_s": fill,
                "decode_tok_per_s": decode[decode.len() / 2],
                "runs": decode,
            }));
        }
        Ok(json!({ "isa": spinkv_kernels::active_isa().name(), "threads": 1, "rows": rows }))
    }
}
