//! Sliding-window attention (Mistral, Gemma 3 local layers): the same streaming attention as
//! [`KvCache::attend`], each query seeing only the last `window` keys, itself included
//! (transformers' `kv_idx > q_idx - sliding_window`, llama.cpp's `p1 - p0 < n_swa`).
//!
//! The window is counted in cache indices. After [`KvCache::retire`] dropped a run of tokens,
//! a key past the gap is `retired` positions further from the query than its index says; the
//! window then reaches that much further back.
//!
//! Layers marked with their window ([`KvCache::set_layer_windows`]) hold no more than it: once
//! a whole page (after the sinks) is older than every future query's window plus one page of
//! slack, it goes back to the pool (`LayerTable::recycled` counts its tokens). A layer whose
//! window is at most [`FP16_WINDOW_LIMIT`] tokens is never compressed: it holds at most
//! `window + 2·page` tokens, and compressing those few costs the most quality for the least
//! memory (measured on Gemma 3 270M, README). Longer windows (Mistral) are compressed as usual
//! and recycle their oldest compressed pages. The slack page
//! lets a small `truncate` (a chat re-rendering its last turn) keep the cache; a deeper cut
//! goes back to the sinks ([`KvCache::servable_len`]) and the caller feeds the tokens again.

use crate::cache::KvCache;
use crate::error::KvError;
use crate::table::PageKind;

/// Sliding windows up to this many tokens stay fp16 (see [`KvCache::keeps_fp16`]).
pub const FP16_WINDOW_LIMIT: usize = 1024;

impl KvCache {
    /// Attention of n queries at cache indices `start..start + n`, query `i` over keys
    /// `max(0, i + 1 - window)..=i`. `q`, `out` as in [`KvCache::attend`]; `window` ≥ 1.
    pub fn attend_window(
        &self,
        layer: usize,
        q: &[f32],
        start: usize,
        window: usize,
        out: &mut [f32],
    ) -> Result<(), KvError> {
        if window == 0 {
            return Err(KvError::ShapeMismatch {
                what: "sliding window: at least one token",
                expected: 1,
                got: 0,
            });
        }
        self.attend_within(layer, q, start, Some(window), out)
    }

    /// Marks each layer's sliding window (`None`: full attention). Only on an empty cache;
    /// windows must be at least one token.
    pub fn set_layer_windows(&mut self, windows: &[Option<usize>]) -> Result<(), KvError> {
        if windows.len() != self.shape.n_layers {
            return Err(KvError::ShapeMismatch {
                what: "layer windows: one per layer",
                expected: self.shape.n_layers,
                got: windows.len(),
            });
        }
        if windows.contains(&Some(0)) {
            return Err(KvError::ShapeMismatch {
                what: "sliding window: at least one token",
                expected: 1,
                got: 0,
            });
        }
        let held = self.layers.iter().map(|t| t.segment_count()).sum::<usize>();
        if held > 0 {
            return Err(KvError::ShapeMismatch {
                what: "layer windows: set on an empty cache (pages held)",
                expected: 0,
                got: held,
            });
        }
        self.layer_windows = windows.to_vec();
        Ok(())
    }

    /// Each layer's sliding window (`None`: full attention).
    pub fn layer_windows(&self) -> &[Option<usize>] {
        &self.layer_windows
    }

    /// The largest length `<= len` the cache can be cut to and continued from: `len` itself,
    /// unless a sliding-window layer already recycled keys a query at `len` sees; then its
    /// sinks (the tokens before the recycled run, 0 without sinks).
    pub fn servable_len(&self, len: usize) -> usize {
        let p = self.config.page_tokens;
        let mut servable = len.min(self.len());
        for (table, window) in self.layers.iter().zip(&self.layer_windows) {
            if let (Some(window), true) = (window, table.recycled > 0) {
                let sink = table.sink.tokens;
                if servable > sink && servable + 1 < sink + table.recycled + window {
                    servable = sink;
                }
            }
            debug_assert!(table.recycled.is_multiple_of(p));
        }
        servable
    }

    /// Gives back the oldest whole pages of a sliding-window layer that no query at `first_query`
    /// or later can see (keeping one page of slack, see the module doc).
    pub(crate) fn recycle(&mut self, layer: usize, first_query: usize) {
        let Some(window) = self.layer_windows[layer] else {
            return;
        };
        let p = self.config.page_tokens;
        // Keys below this index are out of every future window, with a page to spare.
        let Some(oldest_needed) = (first_query + 1).checked_sub(window + p) else {
            return;
        };
        loop {
            let table = &mut self.layers[layer];
            // The oldest page after the sinks: a sealed one, else a full page of the window run
            // that another page follows (never the newest).
            let front_end = table.sink.tokens + table.recycled + p;
            if front_end > oldest_needed {
                return;
            }
            let (kind, page) = if !table.sealed.is_empty() {
                (PageKind::Sealed, table.sealed.remove(0))
            } else if table.window.pages.len() >= 2 {
                table.window.tokens -= p;
                (
                    PageKind::Fp16,
                    table.window.pages.pop_front().expect("two pages"),
                )
            } else {
                return;
            };
            table.recycled += p;
            self.release_page(kind, page);
        }
    }

    /// Whether `layer` keeps every token in fp16 whatever the codec: a sliding window of at
    /// most [`FP16_WINDOW_LIMIT`] tokens (Gemma 3's local layers; Mistral's 4,096 are compressed).
    pub fn keeps_fp16(&self, layer: usize) -> bool {
        matches!(self.layer_windows.get(layer), Some(Some(w)) if *w <= FP16_WINDOW_LIMIT)
    }
}

#[cfg(test)]
mod tests {
    use crate::config::{KvConfig, KvShape};
    use crate::KvCache;

    /// Naive f64 softmax attention of one query head over keys `lo..=hi`.
    fn naive(q: &[f32], keys: &[Vec<f32>], values: &[Vec<f32>], lo: usize, hi: usize) -> Vec<f64> {
        let d = q.len();
        let scale = 1.0 / (d as f64).sqrt();
        let scores: Vec<f64> = (lo..=hi)
            .map(|j| {
                let dot: f64 = q
                    .iter()
                    .zip(&keys[j])
                    .map(|(a, b)| *a as f64 * *b as f64)
                    .sum();
                dot * scale
            })
            .collect();
        let m = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let w: Vec<f64> = scores.iter().map(|s| (s - m).exp()).collect();
        let total: f64 = w.iter().sum();
        let mut out = vec![0.0; d];
        for (wi, j) in w.iter().zip(lo..=hi) {
            for (o, v) in out.iter_mut().zip(&values[j]) {
                *o += wi / total * *v as f64;
            }
        }
        out
    }

    #[test]
    fn each_query_sees_exactly_its_window() {
        let shape = KvShape {
            n_layers: 1,
            n_heads: 1,
            n_kv_heads: 1,
            head_dim: 8,
        };
        let config = KvConfig {
            page_tokens: 16,
            ..KvConfig::fp16()
        };
        let mut cache = KvCache::new(shape, config).unwrap();
        let n = 70;
        // Values exactly representable in f16, so the cache stores them as given.
        let value = |t: usize, i: usize| ((t * 7 + i * 3) % 17) as f32 / 8.0 - 1.0;
        let keys: Vec<Vec<f32>> = (0..n)
            .map(|t| (0..8).map(|i| value(t, i)).collect())
            .collect();
        let values: Vec<Vec<f32>> = (0..n)
            .map(|t| (0..8).map(|i| value(t + 5, i)).collect())
            .collect();
        cache.append(0, &keys.concat(), &values.concat()).unwrap();
        let queries: Vec<f32> = (0..n)
            .flat_map(|t| (0..8).map(move |i| value(t + 3, i)))
            .collect();
        for window in [1, 5, 16, 17, 40, 200] {
            let mut out = vec![0.0; n * 8];
            cache
                .attend_window(0, &queries, 0, window, &mut out)
                .unwrap();
            for t in 0..n {
                let lo = (t + 1).saturating_sub(window);
                let expected = naive(&queries[t * 8..(t + 1) * 8], &keys, &values, lo, t);
                for (got, want) in out[t * 8..(t + 1) * 8].iter().zip(&expected) {
                    assert!(
                        (*got as f64 - want).abs() < 1e-4,
                        "window {window} query {t}"
                    );
                }
            }
        }
        let mut out = vec![0.0; 8];
        assert!(cache
            .attend_window(0, &queries[..8], 0, 0, &mut out)
            .is_err());
    }

    mod recycling {
        use crate::config::{KvCodecKind, KvConfig};
        use crate::rng::SplitMix64;
        use crate::snapshot::tests::{configs, SHAPE};
        use crate::test_support::normals;
        use crate::KvCache;

        const WINDOW: usize = 20;
        const WINDOWS: [Option<usize>; 2] = [Some(WINDOW), None];

        fn windowed(config: &KvConfig) -> KvCache {
            let mut cache = KvCache::new(SHAPE, config.clone()).unwrap();
            cache.set_layer_windows(&WINDOWS).unwrap();
            cache
        }

        /// `n` random tokens for every layer: (keys, values) rows per layer.
        fn tokens(rng: &mut SplitMix64, n: usize) -> Vec<(Vec<f32>, Vec<f32>)> {
            let width = SHAPE.kv_width();
            (0..SHAPE.n_layers)
                .map(|_| (normals(rng, n * width, 1.0), normals(rng, n * width, 1.0)))
                .collect()
        }

        fn append(cache: &mut KvCache, rows: &[(Vec<f32>, Vec<f32>)]) {
            for (layer, (k, v)) in rows.iter().enumerate() {
                cache.append(layer, k, v).unwrap();
            }
        }

        /// Sliding-window attention of `n` queries ending at the cache's end, on `layer`.
        fn windowed_out(cache: &KvCache, layer: usize, n: usize, seed: u64) -> Vec<f32> {
            let q = normals(&mut SplitMix64::new(seed), n * SHAPE.q_width(), 1.0);
            let mut out = vec![0.0; q.len()];
            cache
                .attend_window(layer, &q, cache.len() - n, WINDOW, &mut out)
                .unwrap();
            out
        }

        fn full_out(cache: &KvCache, layer: usize, n: usize, seed: u64) -> Vec<f32> {
            let q = normals(&mut SplitMix64::new(seed), n * SHAPE.q_width(), 1.0);
            let mut out = vec![0.0; q.len()];
            cache.attend(layer, &q, cache.len() - n, &mut out).unwrap();
            out
        }

        fn assert_close(a: &[f32], b: &[f32], what: &str) {
            let err = a
                .iter()
                .zip(b)
                .map(|(x, y)| (x - y).abs())
                .fold(0.0, f32::max);
            assert!(err < 1e-5, "{what}: error {err}");
        }

        /// A local layer holds its window plus two pages (plus the block being appended), stays
        /// fp16 under every codec and attends exactly as an fp16 cache holding every token;
        /// the full-attention layer is untouched.
        #[test]
        fn a_local_layer_recycles_pages_and_attends_as_if_it_held_everything() {
            for config in configs() {
                let p = config.page_tokens;
                let mut cache = windowed(&config);
                let mut plain = KvCache::new(SHAPE, config.clone()).unwrap();
                let mut fp16 = KvCache::new(SHAPE, configs()[0].clone()).unwrap();
                let mut rng = SplitMix64::new(7);
                for (step, chunk) in [5usize, 1, 13, 2, 40, 1, 1, 30]
                    .iter()
                    .cycle()
                    .take(20)
                    .enumerate()
                {
                    let rows = tokens(&mut rng, *chunk);
                    for c in [&mut cache, &mut plain, &mut fp16] {
                        append(c, &rows);
                    }
                    let n = (*chunk).min(3);
                    assert_close(
                        &windowed_out(&cache, 0, n, step as u64),
                        &windowed_out(&fp16, 0, n, step as u64),
                        &format!("{:?} step {step}", config.codec),
                    );
                    assert_eq!(
                        full_out(&cache, 1, n, step as u64),
                        full_out(&plain, 1, n, step as u64)
                    );
                    let stats = cache.stats();
                    assert_eq!(stats.accounting_problems(), Vec::<String>::new());
                    let local = &stats.layers[0];
                    assert_eq!(local.window, WINDOW);
                    assert_eq!(local.compressed_tokens, 0);
                    assert_eq!(local.tokens, cache.len());
                    assert_eq!(local.tokens, local.fp16_tokens + local.recycled_tokens);
                    assert!(
                        local.fp16_tokens <= config.sink_tokens + WINDOW + 2 * p + chunk,
                        "{:?}: {} fp16 tokens",
                        config.codec,
                        local.fp16_tokens
                    );
                }
                assert!(cache.stats().layers[0].recycled_tokens > 100);
                assert_eq!(cache.stats().layers[1], plain.stats().layers[1]);
            }
        }

        /// A window longer than `FP16_WINDOW_LIMIT` (Mistral's) is compressed
        /// as usual and recycles its oldest compressed pages; attention over what it keeps
        /// equals attention over the same cache without recycling.
        #[test]
        fn a_long_window_recycles_compressed_pages() {
            let long = crate::window::FP16_WINDOW_LIMIT + 40;
            let config = KvConfig {
                max_tokens: 2048,
                ..configs()[1].clone()
            };
            let mut cache = KvCache::new(SHAPE, config.clone()).unwrap();
            cache.set_layer_windows(&[Some(long), None]).unwrap();
            let mut plain = KvCache::new(SHAPE, config).unwrap();
            let mut rng = SplitMix64::new(13);
            for _ in 0..12 {
                let rows = tokens(&mut rng, 100);
                append(&mut cache, &rows);
                append(&mut plain, &rows);
            }
            let local = &cache.stats().layers[0];
            assert!(
                local.recycled_tokens > 0 && local.compressed_tokens > 0,
                "{local:?}"
            );
            let q = normals(&mut SplitMix64::new(2), 3 * SHAPE.q_width(), 1.0);
            let (mut a, mut b) = (vec![0.0; q.len()], vec![0.0; q.len()]);
            let start = cache.len() - 3;
            cache.attend_window(0, &q, start, long, &mut a).unwrap();
            plain.attend_window(0, &q, start, long, &mut b).unwrap();
            assert_close(&a, &b, "long window");
            assert_eq!(cache.stats().accounting_problems(), Vec::<String>::new());
        }

        /// A cut within the slack page keeps the cache; a deeper one goes back to the sinks,
        /// and feeding the tokens again gives the same attention as an uncut cache.
        #[test]
        fn deep_truncation_falls_back_to_the_sinks() {
            for config in configs() {
                let mut rng = SplitMix64::new(11);
                let rows = tokens(&mut rng, 100);
                let mut cache = windowed(&config);
                for chunk in 0..10 {
                    let piece: Vec<_> = rows
                        .iter()
                        .map(|(k, v)| {
                            let w = SHAPE.kv_width();
                            (
                                k[chunk * 10 * w..(chunk + 1) * 10 * w].to_vec(),
                                v[chunk * 10 * w..(chunk + 1) * 10 * w].to_vec(),
                            )
                        })
                        .collect();
                    append(&mut cache, &piece);
                }
                assert!(cache.stats().layers[0].recycled_tokens > 0);
                let reference = windowed_out(&cache, 0, 3, 5);
                assert_eq!(cache.servable_len(99), 99);
                cache.truncate(99);
                assert_eq!(cache.len(), 99);
                cache.truncate(60);
                let sinks = if config.codec == KvCodecKind::Fp16 {
                    0
                } else {
                    config.sink_tokens
                };
                assert_eq!(cache.len(), sinks, "{:?}", config.codec);
                assert_eq!(cache.stats().total.recycled_tokens, 0);
                let w = SHAPE.kv_width();
                let rest: Vec<_> = rows
                    .iter()
                    .map(|(k, v)| (k[sinks * w..].to_vec(), v[sinks * w..].to_vec()))
                    .collect();
                append(&mut cache, &rest);
                assert_close(
                    &windowed_out(&cache, 0, 3, 5),
                    &reference,
                    &format!("{:?}", config.codec),
                );
            }
        }

        /// Snapshots keep the windows and the recycled runs; checkpoints restore them; sliding
        /// retirement of a cache with recycled layers keeps the local layer exact (fp16).
        #[test]
        fn snapshots_checkpoints_and_retirement_keep_recycled_layers() {
            for config in configs() {
                let mut rng = SplitMix64::new(3);
                let mut cache = windowed(&config);
                append(&mut cache, &tokens(&mut rng, 90));
                let bytes = cache.snapshot_bytes();
                let back =
                    KvCache::import_snapshot_with_windows(SHAPE, config.clone(), &WINDOWS, &bytes)
                        .unwrap();
                assert_eq!(back.layer_windows(), &WINDOWS);
                assert_eq!(back.snapshot_bytes(), bytes);
                assert_eq!(back.stats().layers, cache.stats().layers);
                assert_eq!(windowed_out(&back, 0, 3, 1), windowed_out(&cache, 0, 3, 1));
                // A cache without windows, or with others, refuses it.
                assert!(KvCache::import_snapshot(SHAPE, config.clone(), &bytes).is_err());
                let other = [Some(WINDOW + 1), None];
                assert!(KvCache::import_snapshot_with_windows(
                    SHAPE,
                    config.clone(),
                    &other,
                    &bytes
                )
                .is_err());

                cache.checkpoint();
                append(&mut cache, &tokens(&mut rng, 70));
                cache.truncate(150);
                assert!(cache.rollback());
                assert_eq!(cache.snapshot_bytes(), bytes);
            }
            // Retirement: the windowed fp16 cache against an fp16 cache without windows.
            let config = configs()[0].clone();
            let mut cache = windowed(&config);
            let mut plain = KvCache::new(SHAPE, config.clone()).unwrap();
            let mut rng = SplitMix64::new(5);
            for round in 0..6 {
                let rows = tokens(&mut rng, 37);
                append(&mut cache, &rows);
                append(&mut plain, &rows);
                let count = cache.retirable().min(48);
                assert_eq!(count, plain.retirable().min(48));
                cache.retire(count).unwrap();
                plain.retire(count).unwrap();
                assert_eq!(cache.len(), plain.len());
                assert_close(
                    &windowed_out(&cache, 0, 3, round),
                    &windowed_out(&plain, 0, 3, round),
                    "retired",
                );
                assert_eq!(cache.stats().accounting_problems(), Vec::<String>::new());
            }
        }
    }
}
