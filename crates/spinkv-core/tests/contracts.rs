//! The contracts moved here from the binding keep their observable behaviour: identity fields,
//! state digest bytes, session files, restore-only-after-every-check, prefix reuse. Pinned
//! values were computed by the binding before the move (same tiny model, same prompt).

mod common;

use std::sync::Arc;

use common::{prompt, write_tiny_model, TempDir};
use spinkv_core::persist::{
    current_identity, load_session, mismatched_fields, read_session, save_session,
    session_file_bytes, transcript_survives,
};
use spinkv_core::prefix::reuse_prefix;
use spinkv_core::{
    hex, state_digest, state_digest_of, IdentityHashes, KvConfig, KvOptions, Model, ModelHashCell,
    OptionValue, Session, SessionError,
};
use spinkv_kv::{KvCache, KvShape};

const TOKENIZER: &str = "abababababababababababababababababababababababababababababababab";
const TEMPLATE: &str = "cdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcd";

fn hashes() -> IdentityHashes {
    let mut hashes = IdentityHashes::default();
    hashes.set_hex("tokenizer_hash", TOKENIZER).unwrap();
    hashes.set_hex("chat_template_hash", TEMPLATE).unwrap();
    hashes
}

fn options(pairs: &[(&str, OptionValue)]) -> KvOptions {
    let mut options = KvOptions::default();
    for (key, value) in pairs {
        options.set(key, value.clone()).unwrap();
    }
    options
}

struct Fixture {
    dir: TempDir,
    model: Arc<Model>,
    hash: ModelHashCell,
}

impl Fixture {
    fn new() -> Fixture {
        let dir = TempDir::new("contracts");
        write_tiny_model(&dir.0);
        let model = Model::load(&dir.0).unwrap();
        Fixture {
            dir,
            model,
            hash: ModelHashCell::new(),
        }
    }

    fn session(&self, options: &KvOptions) -> Session {
        let context = self.model.config().max_position_embeddings;
        let config = KvConfig::from_options(options, Some(context)).unwrap();
        Session::new(Arc::clone(&self.model), config).unwrap()
    }

    /// The state the pinned values were computed on: 150 prompt tokens and 3 decoded.
    fn filled(&self, options: &KvOptions) -> Session {
        let mut session = self.session(options);
        session.prefill(&prompt(150), false).unwrap();
        for token in [5, 9, 11] {
            session.decode(token).unwrap();
        }
        session
    }
}

#[test]
fn identity_fields_are_unchanged_by_the_move() {
    let fx = Fixture::new();
    let session = fx.filled(&KvOptions::default());
    let identity = current_identity(&session, &fx.hash, &hashes()).unwrap();
    let fields: Vec<(&str, String)> = identity
        .fields()
        .into_iter()
        .filter(|(name, _)| *name != "runtime_build")
        .collect();
    let expected = [
        ("cache_format_version", "2"),
        (
            "model_hash",
            "fd0873645fc517bd4ee9043230345fbbd93e640c40b8867b9f86c70cac0c1a9a",
        ),
        ("tokenizer_hash", TOKENIZER),
        ("chat_template_hash", TEMPLATE),
        ("shape", "2 layers, 4 heads / 2 kv heads, head_dim 8"),
        ("transform", "signs+fwht seed=0x5eedcafef00d0001"),
        ("codebook_version", "1"),
        ("bit_allocation", "turbo k=3.5 v=3 key-norm=log-u8"),
        ("outlier_policy", "rotation spreads outlier channels"),
        ("recent_window", "window 256 + 4 sink tokens"),
        ("page_size", "32 tokens"),
        (
            "context_digest",
            "b98c42f7e92d6c42dc457624b80b77f1e0ee26c5e4e7a507b1b4eb1dccc90e15 (153 tokens)",
        ),
    ];
    let expected: Vec<(&str, String)> = expected
        .into_iter()
        .map(|(k, v)| (k, v.to_string()))
        .collect();
    assert_eq!(fields, expected);
    assert_eq!(identity.runtime_build, spinkv_core::runtime_build());

    let kivi = fx.filled(&options(&[
        ("preset", OptionValue::Text("kivi2".into())),
        ("window", OptionValue::Count(32)),
    ]));
    let identity = current_identity(&kivi, &fx.hash, &hashes()).unwrap();
    assert_eq!(identity.bit_allocation, "kivi k=2 v=2");
    assert_eq!(
        identity.outlier_policy,
        "per-channel key ranges over 32 tokens"
    );
    let fp16 = fx.filled(&options(&[("preset", OptionValue::Text("fp16".into()))]));
    let identity = current_identity(&fp16, &fx.hash, &hashes()).unwrap();
    assert_eq!(identity.transform, "none");
    assert_eq!(identity.transform_seed, 0);
}

#[test]
fn the_state_digest_hashes_tokens_then_the_snapshot() {
    // A cache filled from fixed rows (fp16: no codec numerics involved), pinned.
    let shape = KvShape {
        n_layers: 2,
        n_heads: 4,
        n_kv_heads: 2,
        head_dim: 8,
    };
    let mut cache = KvCache::new(shape, KvConfig::fp16()).unwrap();
    let rows: Vec<f32> = (0..40 * shape.kv_width())
        .map(|i| (i % 23) as f32 / 8.0 - 1.0)
        .collect();
    for layer in 0..shape.n_layers {
        cache.append(layer, &rows, &rows).unwrap();
    }
    let tokens: Vec<u32> = (0..40).collect();
    let mut bytes: Vec<u8> = tokens.iter().flat_map(|t| t.to_le_bytes()).collect();
    cache.export_snapshot(&mut bytes);
    assert_eq!(
        state_digest_of(&tokens, &cache),
        spinkv_session::digest(&bytes)
    );
    assert_eq!(
        hex(&state_digest_of(&tokens, &cache)),
        "c39f98e3be98d6621daf9526a29b764f4c61f39a21c999ea2d110d2eb27bc9c1"
    );
}

#[test]
fn a_saved_session_restores_to_the_same_state() {
    let fx = Fixture::new();
    let sink = options(&[
        ("window", OptionValue::Count(32)),
        ("sink_tokens", OptionValue::Count(4)),
    ]);
    let session = fx.filled(&sink);
    let path = fx.dir.0.join("chat.spkv");
    let transcript = r#"{"messages":[{"role":"user","content":"hi"}]}"#;
    let written = save_session(&session, &fx.hash, &hashes(), transcript, &path).unwrap();
    let bytes = std::fs::read(&path).unwrap();
    assert_eq!(written, bytes.len());
    let digest = fx.hash.labelled(fx.model.dir()).unwrap();
    assert_eq!(
        bytes,
        session_file_bytes(&session, digest, &hashes(), transcript)
    );

    let (header, intact) = read_session(&path, true).unwrap();
    assert_eq!(header.transcript, transcript);
    assert_eq!(header.identity.context_tokens, 153);
    assert_eq!(intact, Some(true));

    let mut fresh = fx.session(&sink);
    fresh.prefill(&[1, 2, 3], false).unwrap();
    assert_eq!(
        load_session(&mut fresh, &fx.hash, &hashes(), &path).unwrap(),
        transcript
    );
    assert_eq!(state_digest(&fresh), state_digest(&session));
    assert_eq!(fresh.tokens(), session.tokens());
}

#[test]
fn a_refused_file_leaves_the_session_untouched_and_says_why() {
    let fx = Fixture::new();
    let session = fx.filled(&KvOptions::default());
    let path = fx.dir.0.join("chat.spkv");
    save_session(&session, &fx.hash, &hashes(), "{}", &path).unwrap();

    let mut other = fx.session(&options(&[("preset", OptionValue::Text("kivi4".into()))]));
    other.prefill(&[7, 8], false).unwrap();
    let before = state_digest(&other);
    let err = load_session(&mut other, &fx.hash, &IdentityHashes::default(), &path).unwrap_err();
    assert_eq!(
        mismatched_fields(&err).unwrap(),
        [
            "tokenizer_hash",
            "chat_template_hash",
            "transform",
            "codebook_version",
            "bit_allocation",
            "outlier_policy",
            "recent_window"
        ]
    );
    assert!(transcript_survives(&err));
    assert!(err
        .to_string()
        .starts_with(&format!("session file {} cannot reuse", path.display())));
    assert_eq!(state_digest(&other), before);

    // Damaged pages: the header still reads, the whole-file check fails, restore refuses.
    let mut bytes = std::fs::read(&path).unwrap();
    let at = bytes.len() - 100;
    bytes[at] ^= 1;
    std::fs::write(&path, &bytes).unwrap();
    assert_eq!(read_session(&path, true).unwrap().1, Some(false));
    let mut same = fx.session(&KvOptions::default());
    let err = load_session(&mut same, &fx.hash, &hashes(), &path).unwrap_err();
    assert!(matches!(err, SessionError::File { .. }) && transcript_survives(&err));
    assert!(same.is_empty());

    // Not a session file at all: the transcript is lost to this reader.
    std::fs::write(&path, b"hello").unwrap();
    let err = load_session(&mut same, &fx.hash, &hashes(), &path).unwrap_err();
    assert!(!transcript_survives(&err));
    let err = load_session(&mut same, &fx.hash, &hashes(), &fx.dir.0).unwrap_err();
    assert!(err
        .to_string()
        .ends_with("is a directory, not a session file"));
}

#[test]
fn a_prompt_reuses_the_cached_prefix_but_recomputes_its_last_token() {
    let fx = Fixture::new();
    let mut session = fx.session(&KvOptions::default());
    session.prefill(&prompt(40), false).unwrap();
    let mut next = prompt(30);
    next.extend([1, 2, 3]);
    assert_eq!(reuse_prefix(&mut session, &next).unwrap(), 30);
    assert_eq!(session.tokens(), &prompt(30)[..]);
    assert_eq!(reuse_prefix(&mut session, &prompt(30)).unwrap(), 29);
    assert!(reuse_prefix(&mut session, &[]).is_err());
    assert_eq!(session.len(), 29);
}
