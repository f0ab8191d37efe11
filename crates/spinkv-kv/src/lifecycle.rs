//! Cache lifecycle beyond append/truncate: checkpoints for cancellation-safe rollback,
//! sliding-window retirement of whole pages, and geometric reservation of the page pools.
//!
//! Checkpoint: `checkpoint()` records the page tables. Until `commit()` or `rollback()`, every
//! page those tables own is held instead of recycled when the cache lets go of it (sealed away
//! into a compressed page, truncated, retired), and a held fp16 page is copied before a token
//! is written into a slot the checkpoint still counts. `rollback()` then puts the recorded
//! tables back, byte for byte: compressing a window page during the turn does not leak into
//! the restored cache. Held pages cost memory only while the checkpoint lives (at most the
//! pages the turn replaced).
//!
//! Retirement: `retire(n)` drops the `n / page_tokens` oldest full pages after the head (the
//! sink run when sink tokens are configured, else the first page), which stays as an attention
//! sink. Keys are stored after RoPE, so the remaining keys keep their positions; the caller
//! keeps feeding tokens at increasing positions (`position_of`).

use crate::cache::KvCache;
use crate::error::KvError;
use crate::pool::PageId;
use crate::table::{LayerTable, PageKind};

/// The recorded state of a cache and the pages it owns.
pub(crate) struct Checkpoint {
    layers: Vec<LayerTable>,
    retired: usize,
    gap: usize,
    /// Tokens the recorded tables keep in each fp16 page, by page id (0: not owned).
    fp16_tokens: Vec<usize>,
    /// Whether the recorded tables own each sealed page, by page id.
    sealed_owned: Vec<bool>,
    /// Owned pages the cache let go of since the checkpoint.
    held: Vec<(PageKind, PageId)>,
}

impl Checkpoint {
    /// Tokens of `page` the checkpoint needs (0 when it does not own the page).
    pub(crate) fn owned_tokens(&self, kind: PageKind, page: PageId) -> usize {
        match kind {
            PageKind::Fp16 => self.fp16_tokens.get(page.index()).copied().unwrap_or(0),
            PageKind::Sealed => self
                .sealed_owned
                .get(page.index())
                .map_or(0, |&owned| owned as usize),
        }
    }

    /// Pages held for the checkpoint (in use by no table).
    pub(crate) fn held_pages(&self) -> usize {
        self.held.len()
    }

    /// Keeps `page` if the checkpoint owns it; false means the caller recycles it.
    pub(crate) fn hold(&mut self, kind: PageKind, page: PageId) -> bool {
        let owned = self.owned_tokens(kind, page) > 0;
        if owned {
            self.held.push((kind, page));
        }
        owned
    }
}

/// Pool growth after `reserve`: doubling, capped at what `max_tokens` can use.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Growth {
    pub(crate) fp16_cap: usize,
    pub(crate) sealed_cap: usize,
    fp16_reserved: usize,
    sealed_reserved: usize,
}

impl KvCache {
    /// Records the current state; `rollback` returns to it until `commit`. A previous
    /// checkpoint is committed first.
    pub fn checkpoint(&mut self) {
        self.commit();
        let p = self.config.page_tokens;
        let mut fp16_tokens = vec![0usize; self.fp16_pool.id_bound()];
        let mut sealed_owned = vec![false; self.sealed_pool.id_bound()];
        for table in &self.layers {
            for run in [&table.sink, &table.window] {
                for (i, page) in run.pages.iter().enumerate() {
                    fp16_tokens[page.index()] = run.count_of(i, p);
                }
            }
            for page in &table.sealed {
                sealed_owned[page.index()] = true;
            }
        }
        self.checkpoint = Some(Checkpoint {
            layers: self.layers.clone(),
            retired: self.retired,
            gap: self.gap,
            fp16_tokens,
            sealed_owned,
            held: Vec::new(),
        });
    }

    pub fn has_checkpoint(&self) -> bool {
        self.checkpoint.is_some()
    }

    /// Forgets the checkpoint and recycles the pages it held.
    pub fn commit(&mut self) {
        let Some(checkpoint) = self.checkpoint.take() else {
            return;
        };
        for (kind, page) in checkpoint.held {
            self.release_page(kind, page);
        }
    }

    /// Restores the state recorded by `checkpoint` exactly; false (and no change) without one.
    pub fn rollback(&mut self) -> bool {
        let Some(checkpoint) = self.checkpoint.take() else {
            return false;
        };
        let p = self.config.page_tokens;
        // Pages allocated since the checkpoint go back to the pools; the ones it owns stay.
        for table in std::mem::take(&mut self.layers) {
            for page in table.sink.pages.iter().chain(&table.window.pages) {
                if checkpoint.owned_tokens(PageKind::Fp16, *page) == 0 {
                    self.fp16_pool.release(*page);
                }
            }
            for page in &table.sealed {
                if checkpoint.owned_tokens(PageKind::Sealed, *page) == 0 {
                    self.sealed_pool.release(*page);
                }
            }
        }
        self.layers = checkpoint.layers;
        self.retired = checkpoint.retired;
        self.gap = checkpoint.gap;
        // A truncate during the turn may have lowered the token count in a page header.
        for table in &self.layers {
            for run in [&table.sink, &table.window] {
                for (i, page) in run.pages.iter().enumerate() {
                    let bytes = self.fp16_pool.page_mut(*page);
                    self.fp16.set_tokens(bytes, run.count_of(i, p));
                }
            }
        }
        true
    }

    /// Tokens at the start of the cache that retirement never drops: the sink run when the
    /// codec keeps sink tokens, else the first page.
    pub fn head_tokens(&self) -> usize {
        if self.codec.is_some() && self.config.sink_tokens > 0 {
            self.config.sink_tokens
        } else {
            self.config.page_tokens
        }
    }

    /// Tokens `retire` could drop now: the full pages after the head.
    pub fn retirable(&self) -> usize {
        let (len, head, p) = (self.len(), self.head_tokens(), self.config.page_tokens);
        if len < head || !self.layers_agree() {
            return 0;
        }
        (len - head) / p * p
    }

    /// Drops the `count / page_tokens` oldest full pages after the head in every layer
    /// (`count` a multiple of `page_tokens`, at most [`KvCache::retirable`]).
    pub fn retire(&mut self, count: usize) -> Result<(), KvError> {
        let p = self.config.page_tokens;
        let retirable = self.retirable();
        if !count.is_multiple_of(p) || count > retirable {
            return Err(KvError::CannotRetire {
                count,
                retirable,
                page_tokens: p,
            });
        }
        if count == 0 {
            return Ok(());
        }
        let head_in_sink = self.codec.is_some() && self.config.sink_tokens > 0;
        let mut released = Vec::new();
        let head = self.head_tokens();
        for table in &mut self.layers {
            let mut pages = count / p;
            // A sliding-window layer's recycled run comes first: after the sink run, or, without
            // sinks, from index 0 (its head page is one of them).
            let recycled_head = if head_in_sink { 0 } else { head };
            let had_recycled = table.recycled > 0;
            if had_recycled {
                let from_recycled = pages.min((table.recycled - recycled_head) / p);
                table.recycled -= from_recycled * p;
                pages -= from_recycled;
            }
            // The head is the sink run, or else the first page: sealed[0] or window[0].
            let sealed_from =
                usize::from(!head_in_sink && !had_recycled && !table.sealed.is_empty());
            let window_from =
                usize::from(!head_in_sink && !had_recycled && table.sealed.is_empty());
            let from_sealed = pages.min(table.sealed.len().saturating_sub(sealed_from));
            released.extend(
                table
                    .sealed
                    .drain(sealed_from..sealed_from + from_sealed)
                    .map(|page| (PageKind::Sealed, page)),
            );
            pages -= from_sealed;
            released.extend(
                table
                    .window
                    .pages
                    .drain(window_from..window_from + pages)
                    .map(|page| (PageKind::Fp16, page)),
            );
            table.window.tokens -= pages * p;
        }
        for (kind, page) in released {
            self.release_page(kind, page);
        }
        self.gap = self.head_tokens();
        self.retired += count;
        Ok(())
    }

    /// Pre-allocates the pages `tokens` tokens need and from then on grows the pools
    /// geometrically (doubling, capped at what `max_tokens` tokens can use).
    pub fn reserve(&mut self, tokens: usize) {
        let p = self.config.page_tokens;
        let fp16_layers: Vec<usize> = (0..self.shape.n_layers)
            .filter(|&l| self.keeps_fp16(l))
            .filter_map(|l| self.layer_windows[l])
            .collect();
        let global_layers = self.shape.n_layers - fp16_layers.len();
        let fp16_for = |n: usize| -> usize {
            let global = if self.codec.is_some() {
                let sink = n.min(self.config.sink_tokens);
                sink.div_ceil(p) + (n - sink).min(self.config.window + p).div_ceil(p)
            } else {
                n.div_ceil(p)
            };
            // A sliding-window layer holds its window plus two pages, and its sinks.
            let local =
                |w: usize| self.config.sink_tokens.div_ceil(p) + n.min(w + 2 * p).div_ceil(p) + 1;
            global * global_layers + fp16_layers.iter().map(|&w| local(w)).sum::<usize>()
        };
        let sealed_for = |n: usize| -> usize {
            if self.codec.is_none() {
                return 0;
            }
            let fp16 = self.config.sink_tokens + self.config.window;
            n.saturating_sub(fp16).div_ceil(p) * global_layers
        };
        let tokens = tokens.min(self.config.max_tokens);
        let growth = Growth {
            fp16_cap: fp16_for(self.config.max_tokens) + self.shape.n_layers,
            sealed_cap: sealed_for(self.config.max_tokens),
            fp16_reserved: fp16_for(tokens),
            sealed_reserved: sealed_for(tokens),
        };
        self.fp16_pool.reserve(growth.fp16_reserved);
        self.sealed_pool.reserve(growth.sealed_reserved);
        self.growth = Some(growth);
    }

    /// Gives back the memory of free pages beyond the reservation (all free pages without
    /// one). Used after `reset` so a cleared conversation holds no more than a fresh one.
    pub fn trim_memory(&mut self) {
        let (fp16, sealed) = self
            .growth
            .map_or((0, 0), |g| (g.fp16_reserved, g.sealed_reserved));
        self.fp16_pool.trim(fp16);
        self.sealed_pool.trim(sealed);
    }

    /// Whether every layer holds the same number of tokens (true between forward passes).
    pub(crate) fn layers_agree(&self) -> bool {
        let p = self.config.page_tokens;
        self.layers.windows(2).all(|w| w[0].len(p) == w[1].len(p))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::KvConfig;
    use crate::rng::SplitMix64;
    use crate::snapshot::tests::{attention, configs, feed, filled, SHAPE};
    use crate::test_support::reference_attention;
    use proptest::prelude::*;

    /// Pages in use equal pages in the tables (plus those a checkpoint holds).
    fn assert_accounting(cache: &KvCache) {
        let in_tables: usize = cache.layers.iter().map(|t| t.segment_count()).sum();
        let held = cache.checkpoint.as_ref().map_or(0, |c| c.held_pages());
        assert_eq!(
            cache.fp16_pool.used() + cache.sealed_pool.used(),
            in_tables + held
        );
    }

    #[derive(Clone, Debug)]
    enum Op {
        Append(usize),
        Truncate(usize),
        Retire(usize),
        Reset,
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => (1usize..40).prop_map(Op::Append),
            2 => (0usize..80).prop_map(Op::Truncate),
            1 => (0usize..4).prop_map(Op::Retire),
            1 => Just(Op::Reset),
        ]
    }

    fn apply(cache: &mut KvCache, op: &Op, rng: &mut SplitMix64) {
        match *op {
            Op::Append(n) => {
                let room = cache.config.max_tokens - cache.len();
                feed(cache, n.min(room), rng);
            }
            Op::Truncate(n) => cache.truncate(n),
            Op::Retire(pages) => {
                let p = cache.config.page_tokens;
                let n = (pages * p).min(cache.retirable());
                cache.retire(n).unwrap();
            }
            Op::Reset => cache.reset(),
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// Whatever a turn does (seal pages, truncate into the recorded state, retire, reset),
        /// rollback returns the exact recorded state, and the cache goes on like a copy of it.
        #[test]
        fn rollback_restores_the_recorded_state_exactly(
            which in 0usize..5,
            before in proptest::collection::vec(op(), 0..5),
            turn in proptest::collection::vec(op(), 1..8),
            seed in any::<u64>(),
        ) {
            let config = configs()[which].clone();
            let mut rng = SplitMix64::new(seed);
            let mut cache = KvCache::new(SHAPE, config.clone()).unwrap();
            for op in &before {
                apply(&mut cache, op, &mut rng);
            }
            let recorded = cache.snapshot_bytes();
            let recorded_attention = attention(&cache);
            cache.checkpoint();
            for op in &turn {
                apply(&mut cache, op, &mut rng);
                assert_accounting(&cache);
            }
            prop_assert!(cache.rollback());
            prop_assert!(!cache.has_checkpoint());
            prop_assert_eq!(cache.snapshot_bytes(), recorded.clone());
            prop_assert_eq!(attention(&cache), recorded_attention);
            assert_accounting(&cache);
            let mut copy = KvCache::import_snapshot(SHAPE, config, &recorded).unwrap();
            feed(&mut cache, 30, &mut SplitMix64::new(1));
            feed(&mut copy, 30, &mut SplitMix64::new(1));
            prop_assert_eq!(cache.snapshot_bytes(), copy.snapshot_bytes());
            assert_accounting(&cache);
        }

        #[test]
        fn commit_keeps_the_turn_and_recycles_what_was_held(
            which in 0usize..5,
            turn in proptest::collection::vec(op(), 1..8),
            seed in any::<u64>(),
        ) {
            let mut rng = SplitMix64::new(seed);
            let mut cache = filled(&configs()[which], 37, seed);
            cache.checkpoint();
            for op in &turn {
                apply(&mut cache, op, &mut rng);
            }
            let after = cache.snapshot_bytes();
            cache.commit();
            prop_assert_eq!(cache.snapshot_bytes(), after);
            assert_accounting(&cache);
            prop_assert!(!cache.rollback());
        }
    }

    #[test]
    fn retirement_keeps_the_head_and_the_newest_pages() {
        for config in configs() {
            let p = config.page_tokens;
            let mut cache = filled(&config, 61, 2);
            let (keys, values) = cache.effective_kv(1);
            let head = cache.head_tokens();
            assert_eq!(cache.retirable(), (61 - head) / p * p);
            assert!(cache.retire(p + 1).is_err());
            cache.retire(2 * p).unwrap();
            assert_eq!(
                (cache.len(), cache.retired(), cache.gap()),
                (61 - 2 * p, 2 * p, head)
            );
            assert_eq!(cache.position_of(head), head + 2 * p);
            assert_accounting(&cache);
            // What is left attends like exact attention over the kept tokens.
            let w = SHAPE.kv_width();
            let kept = |xs: &[f32]| [&xs[..head * w], &xs[(head + 2 * p) * w..]].concat();
            let (k_now, v_now) = cache.effective_kv(1);
            assert_eq!(k_now, kept(&keys));
            assert_eq!(v_now, kept(&values));
            let q = crate::test_support::normals(&mut SplitMix64::new(4), 2 * SHAPE.q_width(), 1.0);
            let mut out = vec![0.0; q.len()];
            cache.attend(1, &q, cache.len() - 2, &mut out).unwrap();
            let expected = reference_attention(&SHAPE, &k_now, &v_now, &q, cache.len() - 2);
            let err = out
                .iter()
                .zip(&expected)
                .map(|(a, b)| (a - b).abs())
                .fold(0.0, f32::max);
            let tolerance = crate::test_support::attention_tolerance(&config);
            assert!(err < tolerance, "{:?}: {err}", config.codec);
            // Snapshots carry the retirement; new pages record their sequence positions.
            feed(&mut cache, 9, &mut SplitMix64::new(8));
            let bytes = cache.snapshot_bytes();
            let back = KvCache::import_snapshot(SHAPE, config.clone(), &bytes).unwrap();
            assert_eq!(back.snapshot_bytes(), bytes);
            assert_eq!(back.retired(), 2 * p);
            // Truncating into the head forgets the retirement.
            cache.truncate(head - 1);
            assert_eq!((cache.retired(), cache.gap()), (0, 0));
            assert_accounting(&cache);
        }
    }

    #[test]
    fn reservation_grows_geometrically_and_trim_returns_to_it() {
        let config = KvConfig {
            max_tokens: 256,
            ..configs()[1].clone()
        };
        let mut cache = KvCache::new(SHAPE, config).unwrap();
        cache.reserve(24);
        let reserved = cache.stats().pages_allocated;
        assert!(reserved > 0 && cache.stats().pages_free == reserved);
        let mut rng = SplitMix64::new(3);
        let mut growth_steps = 0;
        let mut last = reserved;
        for _ in 0..25 {
            feed(&mut cache, 8, &mut rng);
            let now = cache.stats().pages_allocated;
            if now != last {
                growth_steps += 1;
                last = now;
            }
        }
        assert_eq!(cache.len(), 200);
        let used = cache.stats().total.pages_used;
        assert!(
            growth_steps <= 4,
            "{growth_steps} growth steps to {used} pages"
        );
        cache.reset();
        cache.trim_memory();
        assert_eq!(cache.stats().pages_allocated, reserved);
        assert_eq!(
            cache.snapshot_bytes(),
            filled(&configs()[1], 0, 0).snapshot_bytes()
        );

        // A full cache whose turn truncates and rewrites pages (copies the checkpoint forces)
        // grows past the cap one page at a time.
        let mut full = KvCache::new(
            SHAPE,
            KvConfig {
                max_tokens: 16,
                ..configs()[0].clone()
            },
        )
        .unwrap();
        full.reserve(16);
        feed(&mut full, 16, &mut rng);
        full.checkpoint();
        full.truncate(3);
        feed(&mut full, 13, &mut rng);
        assert_eq!(full.stats().pages_allocated, 8, "cap 6, plus two copies");
        assert!(full.rollback());
        assert_accounting(&full);
    }
}
