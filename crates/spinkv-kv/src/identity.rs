//! The cache identity record: everything that must agree before a saved cache may be reused.
//!
//! Cached keys and values are only meaningful for the exact model, tokenizer, chat template,
//! cache layout and codec that produced them; a cache restored under any other combination
//! decodes to garbage without any error. The record lists all of it (the design study's list)
//! and [`CacheIdentity::mismatches`] names the fields that differ. The context digest is not a
//! reuse condition: it identifies *which* tokens a cache holds and is checked against the
//! tokens stored beside the pages (prefix reuse then compares tokens directly).
//!
//! Policies are canonical: settings that cannot change a single cached byte are recorded as
//! `none`/0 (the fp16 codec stores every token in fp16, so its window and sink sizes, seed and
//! codebook are irrelevant), so a cache is never refused over a setting it does not depend on.
//!
//! Encoding (little endian): u16 record version, then the fields in the order of the struct,
//! u32/u64 as such, digests as 32 raw bytes, strings as a u32 length plus UTF-8.

use thiserror::Error;

use crate::codebook::CODEBOOK_VERSION;
use crate::config::{KvCodecKind, KvConfig, KvShape, NormFormat};
use crate::page::PAGE_FORMAT_VERSION;
use crate::wire::{Reader, Truncated, Writer};

pub type Digest = [u8; 32];

/// Version of the identity record's own encoding.
/// 2: the layers' sliding windows.
pub const IDENTITY_VERSION: u16 = 2;

/// Version of the cache's stored form: the page format ([`PAGE_FORMAT_VERSION`]) plus the
/// snapshot layout of `snapshot.rs`. Bump it whenever either changes. 2: each layer's sliding
/// window and recycled tokens in the snapshot.
pub const CACHE_FORMAT_VERSION: u32 = 2;
const _: () = assert!(
    PAGE_FORMAT_VERSION == 1,
    "the page format changed: bump CACHE_FORMAT_VERSION and update this check"
);

/// Longest string field accepted when decoding.
const MAX_STRING: usize = 4096;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CacheIdentity {
    pub cache_format_version: u32,
    /// Content hash of the model's weights and config (not its path).
    pub model_hash: Digest,
    pub tokenizer_hash: Digest,
    pub chat_template_hash: Digest,
    pub shape: KvShape,
    /// Transform family applied before quantization (`none`, `signs+fwht`) and its seed.
    pub transform: String,
    pub transform_seed: u64,
    /// [`CODEBOOK_VERSION`] for codecs with codebooks, else 0.
    pub codebook_version: u32,
    /// Codec and bits per channel, e.g. `turbo k=3.5 v=3 key-norm=log-u8`.
    pub bit_allocation: String,
    pub outlier_policy: String,
    /// Recent-window policy: tokens kept in fp16 at the end and at the start (sinks).
    pub window: u32,
    pub sink_tokens: u32,
    /// Tokens per page.
    pub page_tokens: u32,
    /// Each layer's sliding window (0: full attention); empty when no layer has one. Shown
    /// with `recent_window`: short windows change what is compressed (`KvCache::keeps_fp16`).
    pub sliding_windows: Vec<u32>,
    /// How many tokens the cache holds and a digest of them (see the module doc).
    pub context_tokens: u64,
    pub context_digest: Digest,
    /// Crate version and source commit of the runtime that wrote the cache.
    pub runtime_build: String,
}

/// Values of the identity that the cache itself cannot know.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct IdentityInputs {
    pub model_hash: Digest,
    pub tokenizer_hash: Digest,
    pub chat_template_hash: Digest,
    pub context_tokens: u64,
    pub context_digest: Digest,
    pub runtime_build: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum IdentityError {
    #[error("identity record: {0}")]
    Truncated(#[from] Truncated),
    #[error("identity record version {0} is not supported (this build reads version {IDENTITY_VERSION})")]
    Version(u16),
    #[error("identity record: field {0} is not valid UTF-8 or too long")]
    BadString(&'static str),
    #[error("identity record: {0} trailing bytes")]
    Trailing(usize),
}

/// Names of the fields, as [`CacheIdentity::mismatches`] and [`CacheIdentity::fields`] report
/// them (the design study's list).
pub const FIELD_NAMES: [&str; 13] = [
    "cache_format_version",
    "model_hash",
    "tokenizer_hash",
    "chat_template_hash",
    "shape",
    "transform",
    "codebook_version",
    "bit_allocation",
    "outlier_policy",
    "recent_window",
    "page_size",
    "context_digest",
    "runtime_build",
];

impl CacheIdentity {
    /// The identity of a cache of `shape` under `config`, with the externally known values.
    pub fn new(shape: &KvShape, config: &KvConfig, inputs: IdentityInputs) -> Self {
        let half = |h: f32| format_bits(h);
        let (transform, seed, codebook, bits, outliers, window, sinks) = match config.codec {
            KvCodecKind::Fp16 => (
                "none".to_string(),
                0,
                0,
                "fp16".to_string(),
                "none".to_string(),
                0,
                0,
            ),
            KvCodecKind::Turbo | KvCodecKind::TurboQjl => (
                "signs+fwht".to_string(),
                config.seed,
                CODEBOOK_VERSION as u32,
                format!(
                    "{} k={} v={} key-norm={}",
                    config.codec.name(),
                    half(config.k_bits),
                    half(config.v_bits),
                    match config.key_norm {
                        NormFormat::LogU8 => "log-u8",
                        NormFormat::F16 => "f16",
                    }
                ),
                "rotation spreads outlier channels".to_string(),
                config.window,
                config.sink_tokens,
            ),
            KvCodecKind::Kivi => (
                "none".to_string(),
                0,
                0,
                format!("kivi k={} v={}", half(config.k_bits), half(config.v_bits)),
                format!("per-channel key ranges over {} tokens", config.kivi_group),
                config.window,
                config.sink_tokens,
            ),
        };
        CacheIdentity {
            cache_format_version: CACHE_FORMAT_VERSION,
            model_hash: inputs.model_hash,
            tokenizer_hash: inputs.tokenizer_hash,
            chat_template_hash: inputs.chat_template_hash,
            shape: *shape,
            transform,
            transform_seed: seed,
            codebook_version: codebook,
            bit_allocation: bits,
            outlier_policy: outliers,
            window: window as u32,
            sink_tokens: sinks as u32,
            page_tokens: config.page_tokens as u32,
            sliding_windows: Vec::new(),
            context_tokens: inputs.context_tokens,
            context_digest: inputs.context_digest,
            runtime_build: inputs.runtime_build,
        }
    }

    /// The identity of a cache whose layers have these sliding windows (`None`: full
    /// attention), as `KvCache::layer_windows` reports them.
    pub fn with_layer_windows(mut self, windows: &[Option<usize>]) -> Self {
        self.sliding_windows = if windows.iter().any(Option::is_some) {
            windows.iter().map(|w| w.unwrap_or(0) as u32).collect()
        } else {
            Vec::new()
        };
        self
    }

    /// Each layer's sliding window (`None`: full attention), for `KvCache::import_snapshot_with_windows`.
    pub fn layer_windows(&self) -> Vec<Option<usize>> {
        if self.sliding_windows.is_empty() {
            return vec![None; self.shape.n_layers];
        }
        self.sliding_windows
            .iter()
            .map(|&w| (w > 0).then_some(w as usize))
            .collect()
    }

    /// Names of the reuse conditions on which `self` and `other` differ (every field of
    /// [`FIELD_NAMES`] except `context_digest`); empty when a cache may be reused.
    pub fn mismatches(&self, other: &CacheIdentity) -> Vec<&'static str> {
        let mine = self.fields();
        let theirs = other.fields();
        mine.iter()
            .zip(&theirs)
            .filter(|((name, a), (_, b))| *name != "context_digest" && a != b)
            .map(|((name, _), _)| *name)
            .collect()
    }

    /// Every field as (name, display value), in [`FIELD_NAMES`] order.
    pub fn fields(&self) -> Vec<(&'static str, String)> {
        let s = &self.shape;
        let values = [
            self.cache_format_version.to_string(),
            hex(&self.model_hash),
            hex(&self.tokenizer_hash),
            hex(&self.chat_template_hash),
            format!(
                "{} layers, {} heads / {} kv heads, head_dim {}",
                s.n_layers, s.n_heads, s.n_kv_heads, s.head_dim
            ),
            format!("{} seed={:#018x}", self.transform, self.transform_seed),
            self.codebook_version.to_string(),
            self.bit_allocation.clone(),
            self.outlier_policy.clone(),
            format!(
                "window {} + {} sink tokens{}",
                self.window,
                self.sink_tokens,
                describe_windows(&self.sliding_windows)
            ),
            format!("{} tokens", self.page_tokens),
            format!(
                "{} ({} tokens)",
                hex(&self.context_digest),
                self.context_tokens
            ),
            self.runtime_build.clone(),
        ];
        FIELD_NAMES.into_iter().zip(values).collect()
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::new();
        w.u16(IDENTITY_VERSION);
        w.u32(self.cache_format_version);
        w.raw(&self.model_hash);
        w.raw(&self.tokenizer_hash);
        w.raw(&self.chat_template_hash);
        for dim in [
            self.shape.n_layers,
            self.shape.n_heads,
            self.shape.n_kv_heads,
            self.shape.head_dim,
        ] {
            w.u32(dim as u32);
        }
        w.blob(self.transform.as_bytes());
        w.u64(self.transform_seed);
        w.u32(self.codebook_version);
        w.blob(self.bit_allocation.as_bytes());
        w.blob(self.outlier_policy.as_bytes());
        w.u32(self.window);
        w.u32(self.sink_tokens);
        w.u32(self.page_tokens);
        w.u32(self.sliding_windows.len() as u32);
        for &window in &self.sliding_windows {
            w.u32(window);
        }
        w.u64(self.context_tokens);
        w.raw(&self.context_digest);
        w.blob(self.runtime_build.as_bytes());
        w.bytes
    }

    /// Decodes a record written by [`CacheIdentity::encode`]; never panics.
    pub fn decode(bytes: &[u8]) -> Result<CacheIdentity, IdentityError> {
        let mut r = Reader::new(bytes);
        let version = r.u16()?;
        if version != IDENTITY_VERSION {
            return Err(IdentityError::Version(version));
        }
        let string = |r: &mut Reader<'_>, name: &'static str| -> Result<String, IdentityError> {
            let raw = r.blob()?;
            if raw.len() > MAX_STRING {
                return Err(IdentityError::BadString(name));
            }
            String::from_utf8(raw.to_vec()).map_err(|_| IdentityError::BadString(name))
        };
        let identity = CacheIdentity {
            cache_format_version: r.u32()?,
            model_hash: r.digest()?,
            tokenizer_hash: r.digest()?,
            chat_template_hash: r.digest()?,
            shape: KvShape {
                n_layers: r.u32()? as usize,
                n_heads: r.u32()? as usize,
                n_kv_heads: r.u32()? as usize,
                head_dim: r.u32()? as usize,
            },
            transform: string(&mut r, "transform")?,
            transform_seed: r.u64()?,
            codebook_version: r.u32()?,
            bit_allocation: string(&mut r, "bit_allocation")?,
            outlier_policy: string(&mut r, "outlier_policy")?,
            window: r.u32()?,
            sink_tokens: r.u32()?,
            page_tokens: r.u32()?,
            sliding_windows: {
                let n = r.u32()? as usize;
                if n > r.remaining() / 4 {
                    return Err(IdentityError::BadString("sliding_windows"));
                }
                (0..n).map(|_| r.u32()).collect::<Result<Vec<_>, _>>()?
            },
            context_tokens: r.u64()?,
            context_digest: r.digest()?,
            runtime_build: string(&mut r, "runtime_build")?,
        };
        if !r.is_empty() {
            return Err(IdentityError::Trailing(r.remaining()));
        }
        Ok(identity)
    }
}

/// `; sliding window 512 on layers 0-4,6-10 (fp16, recycled)` for the `recent_window` field.
fn describe_windows(windows: &[u32]) -> String {
    let mut by_size: Vec<(u32, Vec<usize>)> = Vec::new();
    for (layer, &w) in windows.iter().enumerate().filter(|(_, w)| **w > 0) {
        match by_size.iter_mut().find(|(size, _)| *size == w) {
            Some((_, layers)) => layers.push(layer),
            None => by_size.push((w, vec![layer])),
        }
    }
    let mut text = String::new();
    for (size, layers) in by_size {
        let mut ranges: Vec<String> = Vec::new();
        let mut i = 0;
        while i < layers.len() {
            let mut j = i;
            while j + 1 < layers.len() && layers[j + 1] == layers[j] + 1 {
                j += 1;
            }
            ranges.push(if i == j {
                layers[i].to_string()
            } else {
                format!("{}-{}", layers[i], layers[j])
            });
            i = j + 1;
        }
        let kept = if size as usize <= crate::window::FP16_WINDOW_LIMIT {
            "fp16, recycled"
        } else {
            "recycled"
        };
        text += &format!(
            "; sliding window {size} on layers {} ({kept})",
            ranges.join(",")
        );
    }
    text
}

/// Bits per channel from a config value: "3.5", "3", "16".
fn format_bits(bits: f32) -> String {
    let half = (bits * 2.0).round() as i64;
    if half % 2 == 0 {
        format!("{}", half / 2)
    } else {
        format!("{}.5", half / 2)
    }
}

/// Lowercase hex, the way digests are shown and exchanged.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A digest from the 64 hex digits [`hex`] writes (either case).
pub fn parse_hex_digest(text: &str) -> Result<Digest, HexError> {
    if text.len() != 64 {
        return Err(HexError::Length(text.len()));
    }
    // Checked up front: `from_str_radix` alone would take "+f" as a digit pair.
    if !text.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(HexError::NotHex);
    }
    let mut digest = [0u8; 32];
    for (byte, pair) in digest.iter_mut().zip(text.as_bytes().chunks_exact(2)) {
        let pair = std::str::from_utf8(pair).map_err(|_| HexError::NotHex)?;
        *byte = u8::from_str_radix(pair, 16).map_err(|_| HexError::NotHex)?;
    }
    Ok(digest)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Error)]
pub enum HexError {
    #[error("must be 64 hex digits, got {0}")]
    Length(usize),
    #[error("is not hex")]
    NotHex,
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const SHAPE: KvShape = KvShape {
        n_layers: 30,
        n_heads: 9,
        n_kv_heads: 3,
        head_dim: 64,
    };

    fn inputs() -> IdentityInputs {
        IdentityInputs {
            model_hash: [1; 32],
            tokenizer_hash: [2; 32],
            chat_template_hash: [3; 32],
            context_tokens: 17,
            context_digest: [4; 32],
            runtime_build: "spinkv 0.1.0+abc".into(),
        }
    }

    #[test]
    fn round_trips_and_names_every_differing_field() {
        let a = CacheIdentity::new(&SHAPE, &KvConfig::turbo(), inputs());
        assert_eq!(CacheIdentity::decode(&a.encode()).unwrap(), a);
        assert_eq!(a.fields().len(), FIELD_NAMES.len());
        assert!(a.mismatches(&a).is_empty());
        assert_eq!(a.bit_allocation, "turbo k=3.5 v=3 key-norm=log-u8");

        let fp16 = CacheIdentity::new(&SHAPE, &KvConfig::fp16(), inputs());
        assert_eq!(
            a.mismatches(&fp16),
            [
                "transform",
                "codebook_version",
                "bit_allocation",
                "outlier_policy",
                "recent_window"
            ]
        );
        let mut other = CacheIdentity::new(
            &KvShape {
                n_layers: 2,
                ..SHAPE
            },
            &KvConfig {
                page_tokens: 16,
                seed: 9,
                ..KvConfig::turbo()
            },
            IdentityInputs {
                model_hash: [9; 32],
                context_digest: [0; 32],
                ..inputs()
            },
        );
        assert_eq!(
            a.mismatches(&other),
            ["model_hash", "shape", "transform", "page_size"]
        );
        other.runtime_build = "spinkv 0.2.0".into();
        other.tokenizer_hash = [0; 32];
        assert!(a.mismatches(&other).contains(&"runtime_build"));
        assert!(a.mismatches(&other).contains(&"tokenizer_hash"));
    }

    #[test]
    fn sliding_windows_are_recorded_and_compared() {
        let plain = CacheIdentity::new(&SHAPE, &KvConfig::turbo(), inputs());
        let windows: Vec<Option<usize>> = (0..SHAPE.n_layers)
            .map(|l| (!(l + 1).is_multiple_of(6)).then_some(512))
            .collect();
        let gemma = plain.clone().with_layer_windows(&windows);
        assert_eq!(CacheIdentity::decode(&gemma.encode()).unwrap(), gemma);
        assert_eq!(gemma.layer_windows(), windows);
        assert_eq!(plain.layer_windows(), vec![None; SHAPE.n_layers]);
        assert_eq!(plain.clone().with_layer_windows(&[None; 30]), plain);
        assert_eq!(gemma.mismatches(&plain), ["recent_window"]);
        let shown = &gemma.fields()[9].1;
        assert!(
            shown.ends_with(
                "; sliding window 512 on layers 0-4,6-10,12-16,18-22,24-28 (fp16, recycled)"
            ),
            "{shown}"
        );
        let mut bytes = gemma.encode();
        bytes.truncate(bytes.len() - 3);
        assert!(CacheIdentity::decode(&bytes).is_err());
    }

    #[test]
    fn settings_a_codec_ignores_do_not_split_identities() {
        let plain = CacheIdentity::new(&SHAPE, &KvConfig::fp16(), inputs());
        let tweaked = CacheIdentity::new(
            &SHAPE,
            &KvConfig {
                window: 7,
                seed: 3,
                sink_tokens: 4,
                ..KvConfig::fp16()
            },
            inputs(),
        );
        assert_eq!(plain, tweaked);
        let kivi = CacheIdentity::new(&SHAPE, &KvConfig::kivi(2), inputs());
        let kivi_seed = CacheIdentity::new(
            &SHAPE,
            &KvConfig {
                seed: 5,
                ..KvConfig::kivi(2)
            },
            inputs(),
        );
        assert_eq!(kivi, kivi_seed);
    }

    #[test]
    fn hex_digests_round_trip_and_bad_text_is_refused() {
        let digest: Digest = std::array::from_fn(|i| (i * 9) as u8);
        assert_eq!(parse_hex_digest(&hex(&digest)), Ok(digest));
        assert_eq!(parse_hex_digest(&hex(&digest).to_uppercase()), Ok(digest));
        assert_eq!(parse_hex_digest("abc"), Err(HexError::Length(3)));
        assert_eq!(parse_hex_digest(&"g".repeat(64)), Err(HexError::NotHex));
        // Multi-byte characters must not split into "pairs" that happen to parse.
        assert_eq!(
            parse_hex_digest(&format!("{}é", "0".repeat(62))),
            Err(HexError::NotHex)
        );
        assert_eq!(parse_hex_digest(&"+1".repeat(32)), Err(HexError::NotHex));
    }

    #[test]
    fn decoding_rejects_other_versions_and_trailing_bytes() {
        let a = CacheIdentity::new(&SHAPE, &KvConfig::kivi(4), inputs());
        let mut bytes = a.encode();
        bytes.push(0);
        assert_eq!(
            CacheIdentity::decode(&bytes),
            Err(IdentityError::Trailing(1))
        );
        bytes[0] = 1;
        assert_eq!(
            CacheIdentity::decode(&bytes),
            Err(IdentityError::Version(1))
        );
    }

    proptest! {
        #[test]
        fn decoding_arbitrary_or_damaged_records_never_panics(
            bytes in proptest::collection::vec(any::<u8>(), 0..400),
            flips in proptest::collection::vec((0usize..400, any::<u8>()), 0..6),
            cut in 0usize..400,
        ) {
            let _ = CacheIdentity::decode(&bytes);
            let mut good = CacheIdentity::new(&SHAPE, &KvConfig::turbo(), inputs()).encode();
            for (at, value) in flips {
                let n = good.len();
                good[at % n] = value;
            }
            let _ = CacheIdentity::decode(&good);
            let _ = CacheIdentity::decode(&good[..cut.min(good.len())]);
        }
    }
}
