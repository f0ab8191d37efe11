//! Cache snapshots: the pages exactly as stored (compressed pages stay compressed) and a fresh
//! cache rebuilt from them.
//!
//! Layout (little endian):
//!
//! ```text
//! "SKVS"  u32 n_layers  u32 page_tokens  u32 fp16_page_bytes  u32 sealed_page_bytes
//! u64 retired  u64 gap
//! n_layers × (u32 sink_tokens, u32 sealed_pages, u32 window_tokens,
//!             u32 sliding_window (0: full attention), u32 recycled_tokens)
//! page images, layer by layer, in token order (sink pages, sealed pages, window pages)
//! ```
//!
//! Every image carries the sealed flag and a checksum: sealed pages as the codec wrote them,
//! fp16 pages as a canonical copy (rows beyond the page's token count zeroed). An export of a
//! cache is therefore a pure function of what the cache holds, whatever its page ids or the
//! stale bytes of recycled pages, and two caches with equal exports attend identically.
//!
//! [`KvCache::import_snapshot`] validates before it returns anything: the table against the
//! configuration, every page's header field by field against the header the cache itself would
//! write at that place (codec, bits, codebook version, layer, shape, token count, position,
//! section offsets), its checksum, and that every value it decodes to is finite. It builds a
//! new cache; the caller swaps it in only on success.

use thiserror::Error;

use crate::cache::KvCache;
use crate::config::{KvConfig, KvShape};
use crate::page::{parse_page, PageError, PageHeader, FLAG_SEALED};
use crate::table::{LayerTable, PageKind};
use crate::window::FP16_WINDOW_LIMIT;
use crate::wire::{Reader, Truncated, Writer};

pub const SNAPSHOT_MAGIC: [u8; 4] = *b"SKVS";

#[derive(Debug, Clone, PartialEq, Error)]
pub enum SnapshotError {
    #[error("KV snapshot {0}")]
    Truncated(#[from] Truncated),
    #[error("not a KV snapshot (magic {0:02x?})")]
    BadMagic([u8; 4]),
    #[error("KV snapshot {what} is {found}, this cache needs {expected}")]
    Mismatch {
        what: &'static str,
        expected: u64,
        found: u64,
    },
    #[error("KV snapshot layer {layer}: {reason}")]
    BadTable { layer: usize, reason: String },
    #[error("KV snapshot holds {tokens} tokens, more than this cache's capacity of {max}")]
    TooLong { tokens: usize, max: usize },
    #[error("KV snapshot retirement of {retired} tokens at {gap} is inconsistent: {reason}")]
    BadRetirement {
        retired: u64,
        gap: u64,
        reason: &'static str,
    },
    #[error("KV snapshot layer {layer} page {index}: {source}")]
    Page {
        layer: usize,
        index: usize,
        source: PageError,
    },
    #[error("KV snapshot layer {layer} page {index}: header field {field} is not what this cache writes there")]
    Header {
        layer: usize,
        index: usize,
        field: &'static str,
    },
    #[error("KV snapshot layer {layer} page {index}: holds non-finite values")]
    NonFinite { layer: usize, index: usize },
    #[error("KV snapshot has {0} bytes after its last page")]
    Trailing(usize),
}

/// The per-layer table as a snapshot records it.
#[derive(Clone, Copy, Debug)]
struct TableCounts {
    sink_tokens: usize,
    sealed_pages: usize,
    window_tokens: usize,
    /// The layer's sliding window, 0 for full attention.
    sliding_window: usize,
    recycled_tokens: usize,
}

impl KvCache {
    /// Appends the snapshot of this cache to `out` (see the module doc for the layout).
    pub fn export_snapshot(&self, out: &mut Vec<u8>) {
        let p = self.config.page_tokens;
        let mut w = Writer {
            bytes: std::mem::take(out),
        };
        w.raw(&SNAPSHOT_MAGIC);
        w.u32(self.shape.n_layers as u32);
        w.u32(p as u32);
        w.u32(self.fp16_pool.page_bytes() as u32);
        w.u32(self.sealed_page_bytes() as u32);
        w.u64(self.retired as u64);
        w.u64(self.gap as u64);
        for (table, window) in self.layers.iter().zip(&self.layer_windows) {
            w.u32(table.sink.tokens as u32);
            w.u32(table.sealed.len() as u32);
            w.u32(table.window.tokens as u32);
            w.u32(window.unwrap_or(0) as u32);
            w.u32(table.recycled as u32);
        }
        let mut image = vec![0u8; self.fp16_pool.page_bytes()];
        for (layer, table) in self.layers.iter().enumerate() {
            for index in 0..table.segment_count() {
                let seg = table.segment(index, p);
                match seg.kind {
                    PageKind::Fp16 => {
                        let first = self.position_of(seg.first);
                        self.fp16.canonical_image(
                            self.fp16_pool.page(seg.page),
                            layer,
                            first,
                            seg.count,
                            &mut image,
                        );
                        w.raw(&image);
                    }
                    PageKind::Sealed => w.raw(self.sealed_pool.page(seg.page)),
                }
            }
        }
        *out = w.bytes;
    }

    /// The snapshot of this cache as a new byte vector.
    pub fn snapshot_bytes(&self) -> Vec<u8> {
        let mut out = Vec::new();
        self.export_snapshot(&mut out);
        out
    }

    /// A new cache of `shape` and `config` holding the snapshot's pages, or the first problem
    /// found. Never panics, whatever `bytes` holds. For caches without sliding windows.
    pub fn import_snapshot(
        shape: KvShape,
        config: KvConfig,
        bytes: &[u8],
    ) -> Result<KvCache, SnapshotError> {
        Self::import_snapshot_with_windows(shape, config, &vec![None; shape.n_layers], bytes)
    }

    /// [`KvCache::import_snapshot`] for a cache whose layers have these sliding windows
    /// (`KvCache::set_layer_windows`); the snapshot must record the same.
    pub fn import_snapshot_with_windows(
        shape: KvShape,
        config: KvConfig,
        windows: &[Option<usize>],
        bytes: &[u8],
    ) -> Result<KvCache, SnapshotError> {
        let bad_config = |e: crate::error::KvError| SnapshotError::BadTable {
            layer: 0,
            reason: e.to_string(),
        };
        let mut cache = KvCache::new(shape, config).map_err(bad_config)?;
        cache.set_layer_windows(windows).map_err(bad_config)?;
        let p = cache.config.page_tokens;
        let mut r = Reader::new(bytes);
        let magic: [u8; 4] = r.take(4)?.try_into().expect("took 4 bytes");
        if magic != SNAPSHOT_MAGIC {
            return Err(SnapshotError::BadMagic(magic));
        }
        let expect = |what: &'static str, expected: usize, found: u64| {
            if expected as u64 == found {
                Ok(())
            } else {
                Err(SnapshotError::Mismatch {
                    what,
                    expected: expected as u64,
                    found,
                })
            }
        };
        expect("layer count", shape.n_layers, r.u32()? as u64)?;
        expect("page size in tokens", p, r.u32()? as u64)?;
        expect(
            "fp16 page size",
            cache.fp16_pool.page_bytes(),
            r.u32()? as u64,
        )?;
        expect(
            "compressed page size",
            cache.sealed_page_bytes(),
            r.u32()? as u64,
        )?;
        let (retired, gap) = (r.u64()?, r.u64()?);
        let mut counts = Vec::with_capacity(shape.n_layers.min(1 << 16));
        for window in windows {
            let c = TableCounts {
                sink_tokens: r.u32()? as usize,
                sealed_pages: r.u32()? as usize,
                window_tokens: r.u32()? as usize,
                sliding_window: r.u32()? as usize,
                recycled_tokens: r.u32()? as usize,
            };
            expect(
                "sliding window of a layer",
                window.unwrap_or(0),
                c.sliding_window as u64,
            )?;
            counts.push(c);
        }
        let len = cache.check_counts(&counts, retired, gap)?;
        let page_bytes = |c: &TableCounts| {
            c.sink_tokens.div_ceil(p) * cache.fp16_pool.page_bytes()
                + c.sealed_pages * cache.sealed_page_bytes()
                + c.window_tokens.div_ceil(p) * cache.fp16_pool.page_bytes()
        };
        let total: usize = counts.iter().map(page_bytes).sum();
        if total > r.remaining() {
            return Err(SnapshotError::Truncated(Truncated {
                at: r.position(),
                needed: total,
                left: r.remaining(),
            }));
        }
        if total < r.remaining() {
            return Err(SnapshotError::Trailing(r.remaining() - total));
        }
        cache.retired = retired as usize;
        cache.gap = gap as usize;
        for (layer, c) in counts.iter().enumerate() {
            cache.load_layer(layer, c, &mut r)?;
        }
        debug_assert_eq!(cache.len(), len);
        Ok(cache)
    }

    fn sealed_page_bytes(&self) -> usize {
        self.codec.as_ref().map_or(0, |c| c.page_bytes())
    }

    /// Checks the snapshot's tables against this cache's configuration; returns the length.
    fn check_counts(
        &self,
        counts: &[TableCounts],
        retired: u64,
        gap: u64,
    ) -> Result<usize, SnapshotError> {
        let (p, config) = (self.config.page_tokens, &self.config);
        let bad = |layer: usize, reason: String| SnapshotError::BadTable { layer, reason };
        let mut length = None;
        for (layer, c) in counts.iter().enumerate() {
            if self.codec.is_none() && (c.sink_tokens > 0 || c.sealed_pages > 0) {
                return Err(bad(
                    layer,
                    "the fp16 codec has no sink or sealed pages".into(),
                ));
            }
            if c.sink_tokens > config.sink_tokens {
                return Err(bad(
                    layer,
                    format!(
                        "{} sink tokens, configured {}",
                        c.sink_tokens, config.sink_tokens
                    ),
                ));
            }
            if (c.sealed_pages > 0 || c.window_tokens > 0)
                && self.codec.is_some()
                && c.sink_tokens != config.sink_tokens
            {
                return Err(bad(layer, "tokens after an incomplete sink run".into()));
            }
            if c.sliding_window == 0 && c.recycled_tokens > 0 {
                return Err(bad(
                    layer,
                    "recycled tokens on a full-attention layer".into(),
                ));
            }
            if !c.recycled_tokens.is_multiple_of(p) {
                return Err(bad(layer, "recycled tokens: not whole pages".into()));
            }
            let keeps_fp16 = c.sliding_window > 0 && c.sliding_window <= FP16_WINDOW_LIMIT;
            if keeps_fp16 && c.sealed_pages > 0 {
                return Err(bad(
                    layer,
                    "compressed pages on a sliding-window layer".into(),
                ));
            }
            if !keeps_fp16 && self.codec.is_some() && c.window_tokens >= config.window + p {
                return Err(bad(
                    layer,
                    format!(
                        "{} window tokens: a full page beyond the {}-token window",
                        c.window_tokens, config.window
                    ),
                ));
            }
            let len = c
                .sealed_pages
                .saturating_mul(p)
                .saturating_add(c.sink_tokens)
                .saturating_add(c.recycled_tokens)
                .saturating_add(c.window_tokens);
            if len > config.max_tokens {
                return Err(SnapshotError::TooLong {
                    tokens: len,
                    max: config.max_tokens,
                });
            }
            match length {
                None => length = Some(len),
                Some(first) if first != len => {
                    return Err(bad(
                        layer,
                        format!("{len} tokens where layer 0 holds {first}"),
                    ))
                }
                Some(_) => {}
            }
        }
        let len = length.unwrap_or(0);
        let fail = |reason| SnapshotError::BadRetirement {
            retired,
            gap,
            reason,
        };
        if retired == 0 {
            if gap != 0 {
                return Err(fail("a gap without retired tokens"));
            }
        } else {
            if !retired.is_multiple_of(p as u64) {
                return Err(fail("not a whole number of pages"));
            }
            if gap != self.head_tokens() as u64 {
                return Err(fail("the gap is not at the end of the head"));
            }
            if (len as u64) < gap {
                return Err(fail("the cache is shorter than its head"));
            }
            if retired.saturating_add(len as u64) > u32::MAX as u64 {
                return Err(fail("positions beyond the page format's u32 range"));
            }
        }
        Ok(len)
    }

    /// Copies one layer's pages into fresh pool pages, validating each, and builds its table.
    fn load_layer(
        &mut self,
        layer: usize,
        c: &TableCounts,
        r: &mut Reader<'_>,
    ) -> Result<(), SnapshotError> {
        let p = self.config.page_tokens;
        let mut table = LayerTable::default();
        let mut index = 0;
        let mut next = 0usize; // cache index of the next page's first token
        for (tokens, sink) in [(c.sink_tokens, true), (c.window_tokens, false)] {
            if !sink {
                table.recycled = c.recycled_tokens;
                next += c.recycled_tokens;
                for _ in 0..c.sealed_pages {
                    let page = self.alloc_page(PageKind::Sealed);
                    let image = r.take(self.sealed_page_bytes())?;
                    self.sealed_pool.page_mut(page).copy_from_slice(image);
                    table.sealed.push(page);
                    self.check_sealed(page, layer, index, self.position_of(next))?;
                    index += 1;
                    next += p;
                }
            }
            let run = if sink {
                &mut table.sink
            } else {
                &mut table.window
            };
            run.tokens = tokens;
            for i in 0..tokens.div_ceil(p) {
                let count = run.count_of(i, p);
                let page = self.alloc_page(PageKind::Fp16);
                run.pages.push_back(page);
                let bytes = self.fp16_pool.page_mut(page);
                bytes.copy_from_slice(r.take(bytes.len())?);
                let expected = PageHeader {
                    flags: FLAG_SEALED,
                    ..self.fp16.header(layer, self.position_of(next), count)
                };
                check_header(self.fp16_pool.page(page), &expected, layer, index)?;
                if !self.fp16.rows_are_finite(self.fp16_pool.page(page), count) {
                    return Err(SnapshotError::NonFinite { layer, index });
                }
                self.fp16.reopen(self.fp16_pool.page_mut(page));
                index += 1;
                next += count;
            }
        }
        self.layers[layer] = table;
        Ok(())
    }

    fn check_sealed(
        &mut self,
        page: crate::pool::PageId,
        layer: usize,
        index: usize,
        first_token: usize,
    ) -> Result<(), SnapshotError> {
        let codec = self
            .codec
            .as_deref()
            .expect("sealed pages only with a codec");
        let expected = codec.page_header(layer, first_token);
        let bytes = self.sealed_pool.page(page);
        check_header(bytes, &expected, layer, index)?;
        codec.decode_page(
            bytes,
            layer,
            &mut self.staging_keys,
            &mut self.staging_values,
        );
        let finite = |xs: &[f32]| xs.iter().all(|x| x.is_finite());
        if !finite(&self.staging_keys) || !finite(&self.staging_values) {
            return Err(SnapshotError::NonFinite { layer, index });
        }
        Ok(())
    }
}

/// Parses `page` (magic, version, offsets, checksum) and compares every header field with
/// `expected` (whose checksum field is ignored).
fn check_header(
    page: &[u8],
    expected: &PageHeader,
    layer: usize,
    index: usize,
) -> Result<(), SnapshotError> {
    let found = parse_page(page).map_err(|source| SnapshotError::Page {
        layer,
        index,
        source,
    })?;
    let mismatch = found
        .named_fields()
        .into_iter()
        .zip(expected.named_fields())
        .find(|((_, found), (_, expected))| found != expected);
    match mismatch {
        Some(((field, _), _)) => Err(SnapshotError::Header {
            layer,
            index,
            field,
        }),
        None => Ok(()),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::config::NormFormat;
    use crate::rng::SplitMix64;
    use crate::test_support::normals;
    use proptest::prelude::*;

    pub(crate) const SHAPE: KvShape = KvShape {
        n_layers: 2,
        n_heads: 4,
        n_kv_heads: 2,
        head_dim: 16,
    };

    /// Small pages and windows so a few dozen tokens exercise every run of the table.
    pub(crate) fn configs() -> Vec<KvConfig> {
        let small = |c: KvConfig| KvConfig {
            page_tokens: 8,
            window: 8,
            max_tokens: 256,
            ..c
        };
        vec![
            small(KvConfig::fp16()),
            small(KvConfig::turbo_study()),
            small(KvConfig {
                sink_tokens: 5,
                ..KvConfig::turbo_study()
            }),
            small(KvConfig {
                key_norm: NormFormat::F16,
                window: 0,
                ..KvConfig::turbo_qjl()
            }),
            small(KvConfig {
                kivi_group: 4,
                ..KvConfig::kivi(2)
            }),
        ]
    }

    /// Appends `tokens` random tokens to every layer of `cache`, in uneven chunks.
    pub(crate) fn feed(cache: &mut KvCache, tokens: usize, rng: &mut SplitMix64) {
        let width = SHAPE.kv_width();
        let mut left = tokens;
        for chunk in [5usize, 1, 13, 2, 40].iter().cycle() {
            let n = left.min(*chunk);
            if n == 0 {
                break;
            }
            for layer in 0..SHAPE.n_layers {
                let k = normals(rng, n * width, 1.0);
                let v = normals(rng, n * width, 1.0);
                cache.append(layer, &k, &v).unwrap();
            }
            left -= n;
        }
    }

    pub(crate) fn filled(config: &KvConfig, tokens: usize, seed: u64) -> KvCache {
        let mut cache = KvCache::new(SHAPE, config.clone()).unwrap();
        feed(&mut cache, tokens, &mut SplitMix64::new(seed));
        cache
    }

    /// Attention of a few fixed queries at the end of every layer.
    pub(crate) fn attention(cache: &KvCache) -> Vec<f32> {
        let n = cache.len().min(3);
        if n == 0 {
            return Vec::new();
        }
        let q = normals(&mut SplitMix64::new(99), n * SHAPE.q_width(), 1.0);
        let mut all = Vec::new();
        for layer in 0..SHAPE.n_layers {
            let mut out = vec![0.0; q.len()];
            cache.attend(layer, &q, cache.len() - n, &mut out).unwrap();
            all.extend(out);
        }
        all
    }

    #[test]
    fn export_import_round_trips_exactly() {
        for config in configs() {
            for tokens in [0usize, 1, 7, 8, 9, 30, 61] {
                let mut cache = filled(&config, tokens, tokens as u64);
                let bytes = cache.snapshot_bytes();
                let mut back = KvCache::import_snapshot(SHAPE, config.clone(), &bytes)
                    .unwrap_or_else(|e| panic!("{:?} {tokens}: {e}", config.codec));
                assert_eq!(back.len(), tokens);
                assert_eq!(back.snapshot_bytes(), bytes);
                assert_eq!(attention(&back), attention(&cache), "{:?}", config.codec);
                assert_eq!(back.stats().total, cache.stats().total);
                // Both go on identically: the restored tables are complete.
                feed(&mut cache, 11, &mut SplitMix64::new(5));
                feed(&mut back, 11, &mut SplitMix64::new(5));
                assert_eq!(back.snapshot_bytes(), cache.snapshot_bytes());
                cache.truncate(tokens / 2);
                back.truncate(tokens / 2);
                assert_eq!(back.snapshot_bytes(), cache.snapshot_bytes());
            }
        }
    }

    #[test]
    fn import_refuses_other_configurations() {
        let turbo = configs()[1].clone();
        let bytes = filled(&turbo, 40, 1).snapshot_bytes();
        let refuse = |config: KvConfig, shape: KvShape| {
            KvCache::import_snapshot(shape, config, &bytes).unwrap_err()
        };
        let err = refuse(configs()[4].clone(), SHAPE);
        assert!(matches!(err, SnapshotError::Mismatch { .. }), "{err}");
        let err = refuse(
            KvConfig {
                k_bits: 3.0,
                ..turbo.clone()
            },
            SHAPE,
        );
        assert!(matches!(err, SnapshotError::Mismatch { .. }), "{err}");
        let err = refuse(
            KvConfig {
                page_tokens: 16,
                ..turbo.clone()
            },
            SHAPE,
        );
        assert!(matches!(
            err,
            SnapshotError::Mismatch {
                what: "page size in tokens",
                ..
            }
        ));
        let err = refuse(
            KvConfig {
                max_tokens: 32,
                ..turbo.clone()
            },
            SHAPE,
        );
        assert!(matches!(
            err,
            SnapshotError::TooLong {
                tokens: 40,
                max: 32
            }
        ));
        let err = refuse(
            turbo.clone(),
            KvShape {
                n_layers: 3,
                ..SHAPE
            },
        );
        assert!(matches!(
            err,
            SnapshotError::Mismatch {
                what: "layer count",
                ..
            }
        ));
        // A smaller window would have sealed more: the table is not one this cache can hold.
        // (A bigger one can hold it; the identity record is what tells the policies apart.)
        let err = refuse(KvConfig { window: 0, ..turbo }, SHAPE);
        assert!(err.to_string().contains("window"), "{err}");
    }

    #[test]
    fn every_changed_byte_is_caught() {
        for config in [
            configs()[1].clone(),
            configs()[2].clone(),
            configs()[4].clone(),
        ] {
            let bytes = filled(&config, 45, 3).snapshot_bytes();
            for at in 0..bytes.len() {
                let mut bad = bytes.clone();
                bad[at] ^= 0x10;
                assert!(
                    KvCache::import_snapshot(SHAPE, config.clone(), &bad).is_err(),
                    "{:?}: flipping byte {at} of {} went unnoticed",
                    config.codec,
                    bytes.len()
                );
            }
            for cut in 0..bytes.len() {
                assert!(KvCache::import_snapshot(SHAPE, config.clone(), &bytes[..cut]).is_err());
            }
        }
    }

    #[test]
    fn non_finite_values_are_refused_even_with_valid_checksums() {
        let config = configs()[0].clone();
        let cache = filled(&config, 3, 1);
        let mut bytes = cache.snapshot_bytes();
        let header = 4 + 4 * 4 + 16 + 5 * 4 * SHAPE.n_layers;
        // First key half of layer 0 page 0 := +inf, then re-seal the page.
        let page = &mut bytes[header..header + cache.fp16_pool.page_bytes()];
        page[64..66].copy_from_slice(&half::f16::INFINITY.to_le_bytes());
        let parsed = PageHeader::decode(page).unwrap();
        crate::page::write_header(page, &parsed);
        let err = KvCache::import_snapshot(SHAPE, config, &bytes).unwrap_err();
        assert_eq!(err, SnapshotError::NonFinite { layer: 0, index: 0 });
    }

    proptest! {
        #[test]
        fn importing_damaged_snapshots_never_panics(
            which in 0usize..5,
            tokens in 0usize..50,
            flips in proptest::collection::vec((any::<usize>(), any::<u8>()), 0..6),
            cut in any::<usize>(),
        ) {
            let config = configs()[which].clone();
            let mut bytes = filled(&config, tokens, 7).snapshot_bytes();
            for (at, value) in flips {
                let n = bytes.len();
                bytes[at % n] = value;
            }
            let _ = KvCache::import_snapshot(SHAPE, config.clone(), &bytes);
            let _ = KvCache::import_snapshot(SHAPE, config, &bytes[..cut % (bytes.len() + 1)]);
        }

        #[test]
        fn importing_random_bytes_never_panics(
            which in 0usize..5,
            bytes in proptest::collection::vec(any::<u8>(), 0..200),
        ) {
            let mut framed = SNAPSHOT_MAGIC.to_vec();
            framed.extend(&bytes);
            let _ = KvCache::import_snapshot(SHAPE, configs()[which].clone(), &framed);
        }
    }
}
