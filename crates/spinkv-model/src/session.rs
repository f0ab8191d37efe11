//! `Session`: one conversation's KV cache, token history and last logits over a shared model.
//!
//! `tokens` holds every token fed, by sequence position. The cache holds them all, or, after a
//! sliding-window retirement (see `lifecycle`), the head and the newest ones: cache index and
//! position then differ, and the forward pass gets both.

mod lifecycle;

use crate::error::ModelError;
use crate::forward::{forward, Block, LogitsFor, Scratch};
use crate::model::Model;
use crate::parallel::run_in_pool;
use crate::platform::Instant;
use crate::sampler::Sampler;
use crate::timings::{elapsed_ns, ForwardClock, PhaseTimings};
use spinkv_kv::{CacheStats, KvCache, KvConfig};
use std::sync::Arc;

/// Prompt tokens per forward block. Bounds scratch memory (~6 MB of activations for SmolLM2)
/// while keeping each weight block's reuse across tokens high: every block streams all the
/// weights from memory once (pp512 on 2 cores: 64-token blocks ~480-540 tok/s, 256 ~590).
pub const PREFILL_BLOCK_TOKENS: usize = 256;

pub struct Session {
    model: Arc<Model>,
    cache: KvCache,
    tokens: Vec<u32>,
    /// `[vocab]` after the last token, empty before the first forward or after a truncate.
    logits: Vec<f32>,
    scratch: Scratch,
    timings: PhaseTimings,
    max_context: usize,
    /// Retire old pages instead of refusing tokens when the cache is full.
    sliding: bool,
    /// Tokens and logits to return to on `rollback_turn` (the cache keeps its own state).
    mark: Option<(Vec<u32>, Vec<f32>)>,
}

impl Session {
    pub fn new(model: Arc<Model>, kv: KvConfig) -> Result<Session, ModelError> {
        let max_context = kv.max_tokens.min(model.config().max_position_embeddings);
        let mut cache = KvCache::new(model.kv_shape(), kv)?;
        let c = model.config();
        let windows: Vec<Option<usize>> = (0..c.num_hidden_layers).map(|l| c.window(l)).collect();
        cache.set_layer_windows(&windows)?;
        Ok(Session {
            model,
            cache,
            tokens: Vec::new(),
            logits: Vec::new(),
            scratch: Scratch::default(),
            timings: PhaseTimings::default(),
            max_context,
            sliding: false,
            mark: None,
        })
    }

    pub fn model(&self) -> &Arc<Model> {
        &self.model
    }

    /// Most tokens the cache holds: min(model positions, KV `max_tokens`).
    pub fn max_context(&self) -> usize {
        self.max_context
    }

    /// Append `tokens` to the context (batched, in blocks of [`PREFILL_BLOCK_TOKENS`]). With
    /// `all_logits`, returns `[tokens.len() * vocab]` logits, one row per token. Errors are
    /// raised before anything is mutated.
    pub fn prefill(
        &mut self,
        tokens: &[u32],
        all_logits: bool,
    ) -> Result<Option<Vec<f32>>, ModelError> {
        self.check_tokens(tokens)?;
        let start_len = self.tokens.len();
        let started = Instant::now();
        let vocab = self.model.config().vocab_size;
        let mut all = Vec::new();
        if all_logits {
            // A sliding session accepts up to 2^32 tokens: their logits may not fit in memory,
            // and an allocation failure would abort the process.
            let too_large = || {
                ModelError::TooLarge(format!(
                    "logits for {} tokens x {vocab} vocabulary entries do not fit in memory; \
                     prefill fewer tokens at a time",
                    tokens.len()
                ))
            };
            let floats = tokens.len().checked_mul(vocab).ok_or_else(too_large)?;
            all.try_reserve_exact(floats).map_err(|_| too_large())?;
        }
        let block_size = self.block_size();
        let n_chunks = tokens.len().div_ceil(block_size);
        let mut clock = ForwardClock::default();
        let result = {
            let Session {
                model,
                cache,
                tokens: history,
                logits,
                scratch,
                sliding,
                max_context,
                ..
            } = self;
            run_in_pool(|| -> Result<(), ModelError> {
                for (i, chunk) in tokens.chunks(block_size).enumerate() {
                    let want = if all_logits {
                        LogitsFor::All
                    } else if i + 1 == n_chunks {
                        LogitsFor::Last
                    } else {
                        LogitsFor::None
                    };
                    if *sliding {
                        lifecycle::make_room(cache, chunk.len(), *max_context)?;
                    }
                    let block = Block {
                        tokens: chunk,
                        start: cache.len(),
                        position: cache.position_of(cache.len()),
                        want,
                    };
                    forward(model, cache, block, logits, scratch, &mut clock)?;
                    history.extend_from_slice(chunk);
                    if all_logits {
                        all.extend_from_slice(logits);
                    }
                }
                Ok(())
            })
            .and_then(|r| r)
        };
        if let Err(err) = result {
            self.rollback(start_len);
            return Err(err);
        }
        if all_logits {
            let last = &all[all.len() - vocab..];
            self.logits.clear();
            self.logits.extend_from_slice(last);
        }
        let total = elapsed_ns(started);
        clock.finish(total, &mut self.timings);
        self.timings.prefill_tokens += tokens.len() as u64;
        self.timings.prefill_ns += total;
        Ok(all_logits.then_some(all))
    }

    /// Append one token; its logits become [`Session::last_logits`].
    pub fn decode(&mut self, token: u32) -> Result<(), ModelError> {
        self.check_tokens(&[token])?;
        let started = Instant::now();
        let start_len = self.tokens.len();
        let mut clock = ForwardClock::default();
        let result = {
            let Session {
                model,
                cache,
                logits,
                scratch,
                sliding,
                max_context,
                ..
            } = self;
            run_in_pool(|| {
                if *sliding {
                    lifecycle::make_room(cache, 1, *max_context)?;
                }
                let block = Block {
                    tokens: &[token],
                    start: cache.len(),
                    position: cache.position_of(cache.len()),
                    want: LogitsFor::Last,
                };
                forward(model, cache, block, logits, scratch, &mut clock)
            })
            .and_then(|r| r)
        };
        if let Err(err) = result {
            self.rollback(start_len);
            return Err(err);
        }
        self.tokens.push(token);
        let total = elapsed_ns(started);
        clock.finish(total, &mut self.timings);
        self.timings.decode_tokens += 1;
        self.timings.decode_ns += total;
        Ok(())
    }

    /// Draw the next token from the last logits with the session's tokens as the
    /// repetition-penalty history; the time counts as sampling.
    pub fn sample(&mut self, sampler: &mut Sampler) -> Result<u32, ModelError> {
        if self.logits.is_empty() {
            return Err(ModelError::NoLogits);
        }
        let started = Instant::now();
        let token = sampler.sample(&self.logits, &self.tokens);
        self.timings.sample_ns += elapsed_ns(started);
        self.timings.samples += 1;
        Ok(token)
    }

    /// `[vocab]` logits after the last token (empty before any forward or after truncate).
    pub fn last_logits(&self) -> &[f32] {
        &self.logits
    }

    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    /// Roll back to the first `len` tokens (no-op if `len >= self.len()`). The logits of the
    /// new last token are not kept, so feed at least one token before sampling again. After a
    /// retirement, a cut inside the retired span keeps only the head: check `len()` after.
    pub fn truncate(&mut self, len: usize) {
        if len < self.tokens.len() {
            self.rollback(len);
        }
    }

    pub fn reset(&mut self) {
        self.rollback(0);
    }

    pub fn timings(&self) -> &PhaseTimings {
        &self.timings
    }

    pub fn reset_timings(&mut self) {
        self.timings = PhaseTimings::default();
    }

    pub fn cache_stats(&self) -> CacheStats {
        self.cache.stats()
    }

    /// Switches the KV cache's phase timers on (from zero) or off (see `spinkv_kv::PhaseTimes`).
    pub fn set_kv_profiling(&mut self, on: bool) {
        self.cache.set_profiling(on);
    }

    /// KV phase times since profiling was switched on; `None` when it is off.
    pub fn kv_phase_times(&self) -> Option<spinkv_kv::PhaseTimes> {
        self.cache.phase_times()
    }

    fn rollback(&mut self, len: usize) {
        let (retired, gap) = (self.cache.retired(), self.cache.gap());
        let (keep, index) = if retired == 0 || len <= gap {
            (len, len)
        } else if len < gap + retired {
            (gap, gap)
        } else {
            (len, len - retired)
        };
        self.cache.truncate(index);
        // A sliding-window layer that recycled what a query at `index` sees makes the cache
        // cut back to its sinks (before any retirement gap): keep the tokens it holds.
        let keep = if self.cache.len() < index {
            self.cache.len()
        } else {
            keep
        };
        self.tokens.truncate(keep);
        self.logits.clear();
    }

    fn check_tokens(&self, tokens: &[u32]) -> Result<(), ModelError> {
        if tokens.is_empty() {
            return Err(ModelError::EmptyPrompt);
        }
        let vocab_size = self.model.config().vocab_size;
        if let Some((index, &token)) = tokens
            .iter()
            .enumerate()
            .find(|(_, &t)| t as usize >= vocab_size)
        {
            return Err(ModelError::TokenOutOfRange {
                token,
                index,
                vocab_size,
            });
        }
        let (len, limit) = if self.sliding {
            (self.tokens.len(), lifecycle::MAX_POSITIONS)
        } else {
            (self.cache.len(), self.max_context)
        };
        if len + tokens.len() > limit {
            return Err(ModelError::ContextOverflow {
                len,
                adding: tokens.len(),
                max: limit,
            });
        }
        Ok(())
    }
}
