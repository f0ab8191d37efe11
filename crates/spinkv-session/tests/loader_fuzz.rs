//! The session loader never panics, whatever the bytes: random files, damaged files, and files
//! damaged *and then re-checksummed* (so the damage reaches the identity decoder, the token list
//! and every page check instead of stopping at a checksum).
//!
//! CI runs a few thousand cases per property; `PROPTEST_CASES=1000000 cargo test --release -p
//! spinkv-session --test loader_fuzz` is the long run.

use std::ops::Range;

use proptest::prelude::*;
use spinkv_kv::page::{write_header, PageHeader};
use spinkv_kv::{CacheIdentity, KvCache, KvConfig};
use spinkv_session::file::parse_header_bytes;
use spinkv_session::{context_digest, restore, save_bytes};

mod common;
use common::{values, SHAPE};

fn configs() -> [KvConfig; 3] {
    let small = |c: KvConfig| KvConfig {
        page_tokens: 8,
        window: 8,
        max_tokens: 128,
        ..c
    };
    [
        small(KvConfig::fp16()),
        small(KvConfig {
            sink_tokens: 3,
            ..KvConfig::turbo()
        }),
        small(KvConfig {
            kivi_group: 4,
            ..KvConfig::kivi(2)
        }),
    ]
}

fn cases(default: u32) -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn identity(config: &KvConfig, tokens: &[u32], cache: &KvCache) -> CacheIdentity {
    common::identity(config, tokens, cache, "fuzz".into())
}

/// A valid file: `n` tokens, optionally with retired pages.
fn sample(which: usize, n: usize, retire: bool) -> (Vec<u8>, CacheIdentity, KvConfig) {
    let config = configs()[which].clone();
    let mut cache = KvCache::new(SHAPE, config.clone()).unwrap();
    for layer in 0..SHAPE.n_layers {
        let kv = values(layer as u64 + n as u64, n * SHAPE.kv_width());
        cache.append(layer, &kv, &kv).unwrap();
    }
    if retire && cache.retirable() >= 8 {
        cache.retire(8).unwrap();
    }
    let tokens: Vec<u32> = (0..(cache.len() + cache.retired()) as u32).collect();
    let id = identity(&config, &tokens, &cache);
    let bytes = save_bytes(&id, r#"{"messages":[]}"#, &tokens, &cache);
    (bytes, id, config)
}

fn u64_at(bytes: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(bytes.get(at..at + 8)?.try_into().ok()?))
}

fn u32_at(bytes: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(bytes.get(at..at + 4)?.try_into().ok()?))
}

/// Recomputes both digests for whatever lengths the preamble now announces (when they fit).
fn reseal(bytes: &mut [u8]) {
    let (Some(i), Some(t)) = (u64_at(bytes, 16), u64_at(bytes, 24)) else {
        return;
    };
    let Some(end) = 72u64.checked_add(i).and_then(|x| x.checked_add(t)) else {
        return;
    };
    if bytes.len() < 72 + 32 || end as usize > bytes.len() - 32 {
        return;
    }
    let end = end as usize;
    let mut h = blake3::Hasher::new();
    h.update(&bytes[..40]);
    h.update(&bytes[72..end]);
    let header = *h.finalize().as_bytes();
    bytes[40..72].copy_from_slice(&header);
    let body = bytes.len() - 32;
    let file = *blake3::hash(&bytes[..body]).as_bytes();
    bytes[body..].copy_from_slice(&file);
}

/// Byte ranges of every KV page in a valid file.
fn page_spans(bytes: &[u8]) -> Vec<Range<usize>> {
    let (i, t, s) = (
        u64_at(bytes, 16).unwrap() as usize,
        u64_at(bytes, 24).unwrap() as usize,
        u64_at(bytes, 32).unwrap() as usize,
    );
    let state = 72 + i + t;
    let n_tokens = u64_at(bytes, state).unwrap() as usize;
    let snap = state + 8 + 4 * n_tokens;
    let layers = u32_at(bytes, snap + 4).unwrap() as usize;
    let p = u32_at(bytes, snap + 8).unwrap() as usize;
    let fp16 = u32_at(bytes, snap + 12).unwrap() as usize;
    let sealed = u32_at(bytes, snap + 16).unwrap() as usize;
    let mut at = snap + 36 + 20 * layers;
    let mut spans = Vec::new();
    for layer in 0..layers {
        let counts = snap + 36 + 20 * layer;
        let sink = u32_at(bytes, counts).unwrap() as usize;
        let n_sealed = u32_at(bytes, counts + 4).unwrap() as usize;
        let window = u32_at(bytes, counts + 8).unwrap() as usize;
        let sizes = [
            (fp16, sink.div_ceil(p)),
            (sealed, n_sealed),
            (fp16, window.div_ceil(p)),
        ];
        for size in sizes
            .iter()
            .flat_map(|&(size, n)| std::iter::repeat_n(size, n))
        {
            spans.push(at..at + size);
            at += size;
        }
    }
    assert_eq!(at, state + s, "page walk ends at the end of the state");
    spans
}

fn load(bytes: &[u8], id: &CacheIdentity, config: &KvConfig) {
    let _ = parse_header_bytes(bytes);
    if let Ok((header, state)) = restore(bytes, id, config) {
        // Whatever got through is a coherent cache: it saves and restores again identically.
        let again = save_bytes(
            &header.identity,
            &header.transcript,
            &state.tokens,
            &state.cache,
        );
        let (_, back) = restore(&again, id, config).expect("a restored state saves and restores");
        assert_eq!(back.tokens, state.tokens);
        assert_eq!(back.cache.snapshot_bytes(), state.cache.snapshot_bytes());
    }
}

fn mutation() -> impl Strategy<Value = (usize, u8)> {
    (any::<usize>(), any::<u8>())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(cases(2000)))]

    #[test]
    fn random_bytes(which in 0usize..3, magic in any::<bool>(), tail in proptest::collection::vec(any::<u8>(), 0..300)) {
        let (_, id, config) = sample(which, 4, false);
        let mut bytes = if magic { b"SPKVSESS\x01\0\0\0".to_vec() } else { Vec::new() };
        bytes.extend(tail);
        load(&bytes, &id, &config);
    }

    #[test]
    fn damaged_files(
        which in 0usize..3,
        n in 0usize..40,
        retire in any::<bool>(),
        flips in proptest::collection::vec(mutation(), 0..4),
        cut in any::<usize>(),
        insert in proptest::option::of((any::<usize>(), any::<u8>())),
    ) {
        let (mut bytes, id, config) = sample(which, n, retire);
        for (at, value) in flips {
            let len = bytes.len();
            bytes[at % len] = value;
        }
        if let Some((at, value)) = insert {
            let len = bytes.len();
            bytes.insert(at % (len + 1), value);
        }
        let len = bytes.len();
        bytes.truncate(len - cut % 8.min(len + 1));
        load(&bytes, &id, &config);
    }

    #[test]
    fn damaged_then_resealed_files(
        which in 0usize..3,
        n in 0usize..40,
        retire in any::<bool>(),
        flips in proptest::collection::vec(mutation(), 1..4),
        region in 0usize..3,
    ) {
        let (mut bytes, id, config) = sample(which, n, retire);
        // Aim at the preamble lengths, the identity/transcript, or the state.
        let (i, t) = (u64_at(&bytes, 16).unwrap() as usize, u64_at(&bytes, 24).unwrap() as usize);
        let range = match region {
            0 => 8..40,
            1 => 72..72 + i + t,
            _ => 72 + i + t..bytes.len() - 32,
        };
        for (at, value) in flips {
            bytes[range.start + at % range.len()] = value;
        }
        reseal(&mut bytes);
        load(&bytes, &id, &config);
    }

    #[test]
    fn damaged_pages_with_valid_checksums(
        which in 0usize..3,
        n in 1usize..40,
        retire in any::<bool>(),
        page in any::<usize>(),
        flips in proptest::collection::vec((0usize..96, any::<u8>()), 1..4),
    ) {
        let (mut bytes, id, config) = sample(which, n, retire);
        let spans = page_spans(&bytes);
        let span = spans[page % spans.len()].clone();
        let image = &mut bytes[span];
        for (at, value) in flips {
            let len = image.len();
            image[at % len] = value;
        }
        // Re-checksum the page as a writer would, then the file.
        if let Ok(header) = PageHeader::decode(image) {
            if (header.body_end as usize) <= image.len() && header.body_end as usize >= 64 {
                write_header(image, &header);
            }
        }
        reseal(&mut bytes);
        load(&bytes, &id, &config);
    }
}

#[test]
fn the_fuzz_helpers_understand_valid_files() {
    for which in 0..3 {
        let (bytes, id, config) = sample(which, 30, true);
        assert!(!page_spans(&bytes).is_empty());
        let mut copy = bytes.clone();
        reseal(&mut copy);
        assert_eq!(copy, bytes);
        let (_, state) = restore(&bytes, &id, &config).unwrap();
        assert_eq!(state.cache.len() + state.cache.retired(), 30);
    }
}
