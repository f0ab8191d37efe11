//! The `.spkv` session file.
//!
//! ```text
//! offset  size  field
//! 0       8     magic "SPKVSESS"
//! 8       4     format version (u32 LE, this build writes and reads 1)
//! 12      4     flags (0)
//! 16      8     identity record length I (u64 LE)
//! 24      8     transcript length T
//! 32      8     state length S
//! 40      32    header digest: blake3 of bytes 0..40, the identity record and the transcript
//! 72      I     identity record (spinkv_kv::identity)
//! 72+I    T     transcript: UTF-8 JSON written by the caller (messages, sampler settings...)
//! 72+I+T  S     state: u64 token count n, n × u32 token ids (every token fed, by position),
//!               then the KV cache snapshot (spinkv_kv::snapshot: pages exactly as stored)
//! end-32  32    file digest: blake3 of every byte before it
//! ```
//!
//! The file is exactly `72 + I + T + S + 32` bytes. The header digest lets a listing check the
//! identity and transcript without reading the pages; the file digest covers everything. A
//! reader never trusts a length before checking it against the file size, and never panics.
//!
//! Errors split in two: the file is unreadable (its transcript is lost to this reader), or
//! only its cache is unusable (identity mismatch, damaged pages) and the transcript survives.

#[cfg(feature = "fs")]
use std::fs::File;
use std::io;
#[cfg(feature = "fs")]
use std::io::Read;
#[cfg(feature = "fs")]
use std::path::Path;

use spinkv_kv::identity::IdentityError;
use spinkv_kv::wire::{Reader, Writer};
use spinkv_kv::{CacheIdentity, KvCache, KvConfig, SnapshotError};
use thiserror::Error;

use crate::{context_digest, digest};

pub const MAGIC: [u8; 8] = *b"SPKVSESS";
pub const FORMAT_VERSION: u32 = 1;
const PREAMBLE: usize = 72;
const TRAILER: usize = 32;
/// Largest identity record / transcript a reader accepts.
const MAX_IDENTITY: u64 = 1 << 16;
const MAX_TRANSCRIPT: u64 = 1 << 30;

#[derive(Debug, Error)]
pub enum SessionFileError {
    #[error("cannot be read: {0}")]
    Io(#[from] io::Error),
    #[error("is a directory, not a session file")]
    Directory,
    #[error("is empty, not a session file")]
    Empty,
    #[error("is not a spinkv session file (it starts with \"{}\")", .0.escape_ascii())]
    NotSession(Vec<u8>),
    #[error(
        "was written by a newer spinkv (session format {0}; this build reads {FORMAT_VERSION})"
    )]
    FutureVersion(u32),
    #[error("has unsupported session format {0}")]
    BadVersion(u32),
    #[error("has unknown flags {0:#x}")]
    BadFlags(u32),
    #[error("is truncated: its header announces {expected} bytes, the file has {found}")]
    Truncated { expected: u64, found: u64 },
    #[error("has {extra} unexpected bytes at its end")]
    Trailing { extra: u64 },
    #[error("is corrupt: its header or transcript does not match its checksum")]
    HeaderChecksum,
    #[error("has a damaged {0}")]
    Identity(#[from] IdentityError),
    #[error("has a transcript that is not UTF-8")]
    TranscriptNotUtf8,
    #[error("cannot reuse its KV cache: {} differ{}", .0.join(", "), if .0.len() == 1 { "s" } else { "" })]
    IdentityMismatch(Vec<&'static str>),
    #[error("has damaged KV pages: the file does not match its checksum")]
    FileChecksum,
    #[error("has a damaged token list: {0}")]
    Tokens(String),
    #[error("has KV pages that do not match its identity record: {0}")]
    Snapshot(#[from] SnapshotError),
}

impl SessionFileError {
    /// Whether the transcript is still readable (only the KV cache is refused).
    pub fn transcript_intact(&self) -> bool {
        matches!(
            self,
            SessionFileError::IdentityMismatch(_)
                | SessionFileError::FileChecksum
                | SessionFileError::Tokens(_)
                | SessionFileError::Snapshot(_)
        )
    }
}

/// What a listing needs: the identity record and the transcript (checked by the header digest).
#[derive(Clone, Debug)]
pub struct SessionHeader {
    pub version: u32,
    pub identity: CacheIdentity,
    pub transcript: String,
    pub state_bytes: u64,
    pub file_bytes: u64,
}

/// A conversation's runtime state: every token fed and the cache that holds them.
pub struct SessionState {
    pub tokens: Vec<u32>,
    pub cache: KvCache,
}

struct Preamble {
    version: u32,
    identity_len: u64,
    transcript_len: u64,
    state_len: u64,
    header_digest: [u8; 32],
}

/// The complete file for `identity`, `transcript` and the state (`tokens`, `cache`).
pub fn save_bytes(
    identity: &CacheIdentity,
    transcript: &str,
    tokens: &[u32],
    cache: &KvCache,
) -> Vec<u8> {
    let identity = identity.encode();
    let mut state = Writer::new();
    state.u64(tokens.len() as u64);
    for token in tokens {
        state.u32(*token);
    }
    let mut state = state.bytes;
    cache.export_snapshot(&mut state);

    let mut w = Writer::new();
    w.raw(&MAGIC);
    w.u32(FORMAT_VERSION);
    w.u32(0);
    w.u64(identity.len() as u64);
    w.u64(transcript.len() as u64);
    w.u64(state.len() as u64);
    let mut header = blake3::Hasher::new();
    header.update(&w.bytes);
    header.update(&identity);
    header.update(transcript.as_bytes());
    w.raw(header.finalize().as_bytes());
    w.raw(&identity);
    w.raw(transcript.as_bytes());
    w.raw(&state);
    let file = digest(&w.bytes);
    w.raw(&file);
    w.bytes
}

/// Checks magic, version, flags and that the lengths add up to `file_bytes`.
fn parse_preamble(bytes: &[u8], file_bytes: u64) -> Result<Preamble, SessionFileError> {
    if file_bytes == 0 {
        return Err(SessionFileError::Empty);
    }
    let magic_len = bytes.len().min(MAGIC.len());
    if bytes[..magic_len] != MAGIC[..magic_len] {
        return Err(SessionFileError::NotSession(bytes[..magic_len].to_vec()));
    }
    let fields = |r: &mut Reader<'_>| -> Result<_, spinkv_kv::wire::Truncated> {
        r.take(MAGIC.len())?;
        Ok((
            r.u32()?,
            r.u32()?,
            r.u64()?,
            r.u64()?,
            r.u64()?,
            r.digest()?,
        ))
    };
    let Ok((version, flags, identity_len, transcript_len, state_len, header_digest)) =
        fields(&mut Reader::new(bytes))
    else {
        return Err(SessionFileError::Truncated {
            expected: (PREAMBLE + TRAILER) as u64,
            found: file_bytes,
        });
    };
    if version > FORMAT_VERSION {
        return Err(SessionFileError::FutureVersion(version));
    }
    if version != FORMAT_VERSION {
        return Err(SessionFileError::BadVersion(version));
    }
    if flags != 0 {
        return Err(SessionFileError::BadFlags(flags));
    }
    let expected = [identity_len, transcript_len, state_len]
        .iter()
        .try_fold((PREAMBLE + TRAILER) as u64, |acc, &n| acc.checked_add(n))
        .unwrap_or(u64::MAX);
    if expected > file_bytes {
        return Err(SessionFileError::Truncated {
            expected,
            found: file_bytes,
        });
    }
    if expected < file_bytes {
        return Err(SessionFileError::Trailing {
            extra: file_bytes - expected,
        });
    }
    if identity_len > MAX_IDENTITY || transcript_len > MAX_TRANSCRIPT {
        return Err(SessionFileError::HeaderChecksum);
    }
    Ok(Preamble {
        version,
        identity_len,
        transcript_len,
        state_len,
        header_digest,
    })
}

/// Verifies the header digest and decodes identity and transcript.
fn parse_header(
    preamble: &Preamble,
    fixed: &[u8],
    identity: &[u8],
    transcript: &[u8],
    file_bytes: u64,
) -> Result<SessionHeader, SessionFileError> {
    let mut hasher = blake3::Hasher::new();
    hasher.update(&fixed[..40]);
    hasher.update(identity);
    hasher.update(transcript);
    if hasher.finalize().as_bytes() != &preamble.header_digest {
        return Err(SessionFileError::HeaderChecksum);
    }
    let identity = CacheIdentity::decode(identity)?;
    let transcript =
        String::from_utf8(transcript.to_vec()).map_err(|_| SessionFileError::TranscriptNotUtf8)?;
    Ok(SessionHeader {
        version: preamble.version,
        identity,
        transcript,
        state_bytes: preamble.state_len,
        file_bytes,
    })
}

/// Reads and checks the header of the session file at `path` without reading its pages.
#[cfg(feature = "fs")]
pub fn read_header(path: &Path) -> Result<SessionHeader, SessionFileError> {
    let meta = std::fs::metadata(path)?;
    if meta.is_dir() {
        return Err(SessionFileError::Directory);
    }
    let mut file = File::open(path)?;
    let file_bytes = meta.len();
    let mut fixed = Vec::with_capacity(PREAMBLE);
    file.by_ref()
        .take(PREAMBLE as u64)
        .read_to_end(&mut fixed)?;
    let preamble = parse_preamble(&fixed, file_bytes)?;
    let mut identity = vec![0u8; preamble.identity_len as usize];
    file.read_exact(&mut identity)?;
    let mut transcript = vec![0u8; preamble.transcript_len as usize];
    file.read_exact(&mut transcript)?;
    parse_header(&preamble, &fixed, &identity, &transcript, file_bytes)
}

/// Header of a whole file in memory (same checks as [`read_header`]).
pub fn parse_header_bytes(bytes: &[u8]) -> Result<SessionHeader, SessionFileError> {
    let preamble = parse_preamble(&bytes[..bytes.len().min(PREAMBLE)], bytes.len() as u64)?;
    let identity_end = PREAMBLE + preamble.identity_len as usize;
    let transcript_end = identity_end + preamble.transcript_len as usize;
    parse_header(
        &preamble,
        bytes,
        &bytes[PREAMBLE..identity_end],
        &bytes[identity_end..transcript_end],
        bytes.len() as u64,
    )
}

/// Whether the whole-file digest (the last 32 bytes) matches every byte before it: the check
/// that covers the pages, which [`read_header`] leaves out. False for anything too short.
pub fn file_digest_holds(bytes: &[u8]) -> bool {
    match bytes.len().checked_sub(TRAILER) {
        Some(body_len) => {
            let (body, trailer) = bytes.split_at(body_len);
            digest(body) == trailer
        }
        None => false,
    }
}

/// Reads the session file at `path` and checks its whole-file digest.
#[cfg(feature = "fs")]
pub fn file_is_intact(path: &Path) -> Result<bool, SessionFileError> {
    if std::fs::metadata(path)?.is_dir() {
        return Err(SessionFileError::Directory);
    }
    Ok(file_digest_holds(&std::fs::read(path)?))
}

/// Restores the state of a session file in memory for a cache of `config` whose identity is
/// `expected` (its context fields are not compared): header, identity, file checksum, token
/// list, context digest, then every page (`KvCache::import_snapshot`). Nothing is returned
/// unless all of it passed.
pub fn restore(
    bytes: &[u8],
    expected: &CacheIdentity,
    config: &KvConfig,
) -> Result<(SessionHeader, SessionState), SessionFileError> {
    let header = parse_header_bytes(bytes)?;
    let differ = expected.mismatches(&header.identity);
    if !differ.is_empty() {
        return Err(SessionFileError::IdentityMismatch(differ));
    }
    if !file_digest_holds(bytes) {
        return Err(SessionFileError::FileChecksum);
    }
    let body = &bytes[..bytes.len() - TRAILER];
    let state = &body[body.len() - header.state_bytes as usize..];
    let mut r = Reader::new(state);
    let bad = |what: String| SessionFileError::Tokens(what);
    let n = r.u64().map_err(|e| bad(e.to_string()))?;
    if n > (r.remaining() / 4) as u64 {
        return Err(bad(format!(
            "{n} tokens announced, {} bytes left",
            r.remaining()
        )));
    }
    let raw = r.take(n as usize * 4).map_err(|e| bad(e.to_string()))?;
    let tokens: Vec<u32> = raw
        .chunks_exact(4)
        .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    let snapshot = &state[r.position()..];
    let cache = KvCache::import_snapshot_with_windows(
        expected.shape,
        config.clone(),
        &expected.layer_windows(),
        snapshot,
    )?;
    if tokens.len() as u64 != header.identity.context_tokens
        || tokens.len() != cache.len() + cache.retired()
    {
        return Err(bad(format!(
            "{} tokens for a record of {} and a cache of {} (+{} retired)",
            tokens.len(),
            header.identity.context_tokens,
            cache.len(),
            cache.retired()
        )));
    }
    if context_digest(&tokens, cache.retired(), cache.gap()) != header.identity.context_digest {
        return Err(bad("they do not match the identity's context digest".into()));
    }
    Ok((header, SessionState { tokens, cache }))
}

/// Test fixtures shared with the loader fuzz test.
#[cfg(test)]
#[path = "../tests/common/mod.rs"]
mod fixtures;

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) use super::fixtures::SHAPE;
    use super::fixtures::{self, values};

    pub(crate) fn config() -> KvConfig {
        KvConfig {
            page_tokens: 8,
            window: 8,
            max_tokens: 128,
            ..KvConfig::turbo()
        }
    }

    pub(crate) fn identity_for(
        config: &KvConfig,
        tokens: &[u32],
        cache: &KvCache,
    ) -> CacheIdentity {
        fixtures::identity(config, tokens, cache, crate::runtime_build())
    }

    /// A valid session file of `n` tokens (a few pages compressed).
    pub(crate) fn sample_file(n: usize) -> (Vec<u8>, CacheIdentity) {
        let config = config();
        let mut cache = KvCache::new(SHAPE, config.clone()).unwrap();
        for layer in 0..SHAPE.n_layers {
            let kv = values(layer as u64 + 1, n * SHAPE.kv_width());
            cache.append(layer, &kv, &kv).unwrap();
        }
        let tokens: Vec<u32> = (0..n as u32).map(|t| t * 7 % 300).collect();
        let identity = identity_for(&config, &tokens, &cache);
        let transcript = r#"{"messages":[{"role":"user","content":"hi"}]}"#;
        (save_bytes(&identity, transcript, &tokens, &cache), identity)
    }

    #[test]
    fn a_saved_file_restores_exactly() {
        let (bytes, identity) = sample_file(37);
        let (header, state) = restore(&bytes, &identity, &config()).unwrap();
        assert_eq!(header.identity, identity);
        assert!(header.transcript.contains("hi"));
        assert_eq!(state.tokens.len(), 37);
        assert_eq!(state.cache.len(), 37);
        assert!(state.cache.stats().total.compressed_tokens > 0);
        let again = save_bytes(&identity, &header.transcript, &state.tokens, &state.cache);
        assert_eq!(again, bytes, "save(restore(file)) == file");
        assert_eq!(parse_header_bytes(&bytes).unwrap().identity, identity);
    }

    #[test]
    fn each_kind_of_damage_gets_its_own_error() {
        let (bytes, identity) = sample_file(20);
        let load = |b: &[u8]| restore(b, &identity, &config()).err().expect("must fail");
        assert!(matches!(load(&[]), SessionFileError::Empty));
        assert!(matches!(
            load(b"hello world, not a session"),
            SessionFileError::NotSession(_)
        ));
        assert!(matches!(load(b"SPKV"), SessionFileError::Truncated { .. }));
        for cut in [8, 40, 71, 72, 100, bytes.len() - 1] {
            assert!(
                matches!(load(&bytes[..cut]), SessionFileError::Truncated { .. }),
                "cut at {cut}"
            );
        }
        let mut longer = bytes.clone();
        longer.push(0);
        assert!(matches!(
            load(&longer),
            SessionFileError::Trailing { extra: 1 }
        ));
        let mut future = bytes.clone();
        future[8] = 2;
        assert!(matches!(load(&future), SessionFileError::FutureVersion(2)));
        let mut flipped = bytes.clone();
        flipped[80] ^= 1; // inside the identity record
        assert!(matches!(load(&flipped), SessionFileError::HeaderChecksum));
        let mut flipped = bytes.clone();
        let at = bytes.len() - 100; // inside the pages
        flipped[at] ^= 1;
        let err = load(&flipped);
        assert!(matches!(err, SessionFileError::FileChecksum), "{err}");
        assert!(err.transcript_intact());
        let other = CacheIdentity {
            model_hash: [9; 32],
            bit_allocation: "kivi k=2 v=2".into(),
            ..identity.clone()
        };
        let err = restore(&bytes, &other, &config()).err().unwrap();
        assert!(
            matches!(&err, SessionFileError::IdentityMismatch(f) if f == &["model_hash", "bit_allocation"])
        );
        assert_eq!(
            err.to_string(),
            "cannot reuse its KV cache: model_hash, bit_allocation differ"
        );
    }

    #[test]
    fn the_file_digest_covers_every_byte() {
        let (bytes, _) = sample_file(12);
        assert!(file_digest_holds(&bytes));
        for at in [0, 72, bytes.len() / 2, bytes.len() - 1] {
            let mut flipped = bytes.clone();
            flipped[at] ^= 0x10;
            assert!(!file_digest_holds(&flipped), "flip at {at}");
        }
        assert!(!file_digest_holds(&bytes[..31]));
    }

    #[cfg(feature = "fs")]
    #[test]
    fn reading_the_header_from_disk_checks_the_same_things() {
        let dir = std::env::temp_dir().join(format!("spinkv-file-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (bytes, identity) = sample_file(9);
        let path = dir.join("a.spkv");
        std::fs::write(&path, &bytes).unwrap();
        let header = read_header(&path).unwrap();
        assert_eq!(header.identity, identity);
        assert_eq!(header.file_bytes, bytes.len() as u64);
        assert!(matches!(
            read_header(&dir),
            Err(SessionFileError::Directory)
        ));
        assert!(matches!(
            read_header(&dir.join("missing")),
            Err(SessionFileError::Io(e)) if e.kind() == io::ErrorKind::NotFound
        ));
        std::fs::write(&path, &bytes[..bytes.len() / 2]).unwrap();
        assert!(matches!(
            read_header(&path),
            Err(SessionFileError::Truncated { .. })
        ));
        std::fs::write(&path, b"").unwrap();
        assert!(matches!(read_header(&path), Err(SessionFileError::Empty)));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
