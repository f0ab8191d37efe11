//! Session lifecycle: sliding-window retirement, turn checkpoints (cancellation-safe
//! rollback), cache snapshots in and out, and pool reservation.

use super::{Session, PREFILL_BLOCK_TOKENS};
use crate::error::ModelError;
use spinkv_kv::{KvCache, KvError};

/// Positions are u32 in page headers: the most tokens a sliding session ever feeds.
pub(super) const MAX_POSITIONS: usize = u32::MAX as usize;

/// Retires the fewest whole pages after the head so that `adding` more tokens fit in `max`.
pub(super) fn make_room(cache: &mut KvCache, adding: usize, max: usize) -> Result<(), ModelError> {
    let wanted = cache.len() + adding;
    if wanted <= max {
        return Ok(());
    }
    let p = cache.config().page_tokens;
    cache.retire((wanted - max).div_ceil(p) * p)?;
    Ok(())
}

impl Session {
    /// With `on`, a full cache retires its oldest pages after the head (the attention sink)
    /// instead of refusing tokens; positions keep increasing. Needs a context of at least the
    /// head plus one page.
    pub fn set_sliding(&mut self, on: bool) -> Result<(), ModelError> {
        let need = self.cache.head_tokens() + self.cache.config().page_tokens;
        if on && self.max_context < need {
            return Err(ModelError::Kv(KvError::InvalidConfig(format!(
                "a sliding window needs a context of at least {need} tokens (head + one page), \
                 this session holds {}",
                self.max_context
            ))));
        }
        self.sliding = on;
        Ok(())
    }

    pub fn sliding(&self) -> bool {
        self.sliding
    }

    /// Tokens in the cache (`len()` minus the retired ones).
    pub fn cache_len(&self) -> usize {
        self.cache.len()
    }

    /// Tokens dropped from the cache by sliding-window retirement.
    pub fn retired(&self) -> usize {
        self.cache.retired()
    }

    /// Forward block size: sliding needs each block to fit next to the head and a partial page.
    pub(super) fn block_size(&self) -> usize {
        if !self.sliding {
            return PREFILL_BLOCK_TOKENS;
        }
        let room =
            self.max_context + 1 - self.cache.head_tokens() - self.cache.config().page_tokens;
        PREFILL_BLOCK_TOKENS.min(room.max(1))
    }

    /// Records the state a turn starts from; `rollback_turn` returns to it exactly.
    pub fn checkpoint(&mut self) {
        self.cache.checkpoint();
        self.mark = Some((self.tokens.clone(), self.logits.clone()));
    }

    /// Back to the last checkpoint (cache, tokens and logits); false without one.
    pub fn rollback_turn(&mut self) -> bool {
        let Some((tokens, logits)) = self.mark.take() else {
            return false;
        };
        self.cache.rollback();
        self.tokens = tokens;
        self.logits = logits;
        true
    }

    /// Keeps the turn: forgets the checkpoint and recycles the pages it held.
    pub fn commit_turn(&mut self) {
        self.mark = None;
        self.cache.commit();
    }

    pub fn cache(&self) -> &KvCache {
        &self.cache
    }

    /// Replaces the conversation with `tokens` (every token by position) and `cache` (built by
    /// `KvCache::import_snapshot` for this session's shape and configuration). Checks that they
    /// belong together and to this model first; on error nothing changes.
    pub fn restore(&mut self, tokens: Vec<u32>, cache: KvCache) -> Result<(), ModelError> {
        let mismatch = |what: String| Err(ModelError::Kv(KvError::InvalidConfig(what)));
        if *cache.shape() != self.model.kv_shape()
            || cache.config() != self.cache.config()
            || cache.layer_windows() != self.cache.layer_windows()
        {
            return mismatch(
                "the restored cache was built for another shape, policy or sliding windows".into(),
            );
        }
        if tokens.len() != cache.len() + cache.retired() {
            return mismatch(format!(
                "{} tokens for a cache of {} tokens and {} retired",
                tokens.len(),
                cache.len(),
                cache.retired()
            ));
        }
        if cache.len() > self.max_context {
            return Err(ModelError::ContextOverflow {
                len: 0,
                adding: cache.len(),
                max: self.max_context,
            });
        }
        if cache.retired() > 0 && !self.sliding {
            return mismatch("the restored cache slid its window; enable sliding first".into());
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
        self.cache = cache;
        self.tokens = tokens;
        self.logits.clear();
        self.mark = None;
        Ok(())
    }

    /// Pre-allocates cache pages for `tokens` tokens; the pools then grow geometrically.
    pub fn reserve(&mut self, tokens: usize) {
        self.cache.reserve(tokens);
    }

    /// Gives back free cache pages beyond the reservation (after `reset`), and the buffers the
    /// compute threads keep between matrix products (at most 256 tokens × the widest
    /// product's rows of f32 per thread; the next prefill allocates them again).
    pub fn trim_memory(&mut self) {
        self.cache.trim_memory();
        crate::parallel::release_buffers();
    }
}

#[cfg(test)]
mod tests {
    use crate::tests::{prompt, tiny_model, Store};
    use crate::Session;
    use spinkv_kv::{KvCache, KvConfig};

    fn config() -> KvConfig {
        KvConfig {
            page_tokens: 8,
            window: 8,
            max_tokens: 48,
            ..KvConfig::turbo_study()
        }
    }

    #[test]
    fn a_sliding_session_retires_pages_and_keeps_positions_increasing() {
        let (_dir, model) = tiny_model(Store::F32, false);
        let mut plain = Session::new(model.clone(), config()).unwrap();
        let mut sliding = Session::new(model.clone(), config()).unwrap();
        let too_small = KvConfig {
            max_tokens: 15,
            ..config()
        };
        assert!(Session::new(model, too_small)
            .unwrap()
            .set_sliding(true)
            .is_err());
        sliding.set_sliding(true).unwrap();
        let tokens = prompt(200);
        // Sliding prefills in blocks of at most 48 + 1 - 8 - 8 = 33 tokens.
        plain.prefill(&tokens[..33], false).unwrap();
        plain.prefill(&tokens[33..40], false).unwrap();
        sliding.prefill(&tokens[..40], false).unwrap();
        assert_eq!(
            plain.last_logits(),
            sliding.last_logits(),
            "no retirement yet"
        );
        assert!(plain.prefill(&tokens[40..60], false).is_err());
        sliding.prefill(&tokens[40..150], false).unwrap();
        for &t in &tokens[150..200] {
            sliding.decode(t).unwrap();
            assert!(sliding.cache_len() <= 48);
            let cache = sliding.cache();
            assert_eq!(cache.position_of(cache.len() - 1), sliding.len() - 1);
        }
        assert_eq!(sliding.tokens(), &tokens[..]);
        assert_eq!(sliding.retired() + sliding.cache_len(), 200);
        assert!(sliding.last_logits().iter().all(|x| x.is_finite()));
        // Truncating into the retired span keeps the head only.
        sliding.truncate(20);
        assert_eq!(
            (sliding.len(), sliding.cache_len(), sliding.retired()),
            (8, 8, 0)
        );
    }

    #[test]
    fn rollback_turn_restores_tokens_logits_and_pages() {
        let (_dir, model) = tiny_model(Store::F32, false);
        let mut session = Session::new(model.clone(), config()).unwrap();
        session.set_sliding(true).unwrap();
        let tokens = prompt(120);
        session.prefill(&tokens[..30], false).unwrap();
        let (before_tokens, before_logits) =
            (session.tokens().to_vec(), session.last_logits().to_vec());
        let before_pages = session.cache().snapshot_bytes();
        session.checkpoint();
        session.truncate(10);
        session.prefill(&tokens[30..100], false).unwrap();
        session.decode(5).unwrap();
        assert!(session.retired() > 0);
        assert!(session.rollback_turn());
        assert_eq!(session.tokens(), &before_tokens[..]);
        assert_eq!(session.last_logits(), &before_logits[..]);
        assert_eq!(session.cache().snapshot_bytes(), before_pages);
        // It goes on exactly like a session that never saw the turn.
        let mut fresh = Session::new(model, config()).unwrap();
        fresh.set_sliding(true).unwrap();
        fresh.prefill(&tokens[..30], false).unwrap();
        session.prefill(&tokens[30..90], false).unwrap();
        fresh.prefill(&tokens[30..90], false).unwrap();
        assert_eq!(session.last_logits(), fresh.last_logits());
        session.commit_turn();
        assert!(!session.rollback_turn());
    }

    #[test]
    fn a_restored_session_continues_bit_for_bit() {
        let (_dir, model) = tiny_model(Store::F32, false);
        let mut a = Session::new(model.clone(), config()).unwrap();
        a.set_sliding(true).unwrap();
        let tokens = prompt(90);
        a.prefill(&tokens[..70], false).unwrap();
        let bytes = a.cache().snapshot_bytes();
        let cache = KvCache::import_snapshot(model.kv_shape(), config(), &bytes).unwrap();
        let mut b = Session::new(model.clone(), config()).unwrap();
        assert!(
            b.restore(a.tokens().to_vec(), cache).is_err(),
            "needs sliding"
        );
        b.set_sliding(true).unwrap();
        let wrong = KvCache::import_snapshot(model.kv_shape(), config(), &bytes).unwrap();
        assert!(b.restore(tokens[..69].to_vec(), wrong).is_err());
        let cache = KvCache::import_snapshot(model.kv_shape(), config(), &bytes).unwrap();
        b.restore(a.tokens().to_vec(), cache).unwrap();
        assert_eq!(b.tokens(), a.tokens());
        a.prefill(&tokens[70..], false).unwrap();
        b.prefill(&tokens[70..], false).unwrap();
        assert_eq!(a.last_logits(), b.last_logits());
    }
}
