//! The identity record of a session's cache as it is now: the cache's shape and policy, the
//! model's content hash, the tokenizer and chat-template hashes the caller computed (they are
//! Python-side objects), the context and this runtime's build.

use spinkv_kv::{parse_hex_digest, CacheIdentity, Digest, HexError, IdentityInputs};
use spinkv_model::Session;
use spinkv_session::{context_digest, runtime_build};

use crate::error::InvalidInput;

/// The identity inputs only the caller knows. All zeros when not given (a cache made without
/// a tokenizer identity still has one, and only matches another made the same way).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IdentityHashes {
    pub tokenizer_hash: Digest,
    pub chat_template_hash: Digest,
}

impl IdentityHashes {
    /// Names accepted by [`IdentityHashes::set_hex`].
    pub const FIELDS: [&'static str; 2] = ["tokenizer_hash", "chat_template_hash"];

    /// Whether `name` is one of [`IdentityHashes::FIELDS`] (checked before its value is).
    pub fn check_field(name: &str) -> Result<(), InvalidInput> {
        match Self::FIELDS.contains(&name) {
            true => Ok(()),
            false => Err(InvalidInput(format!(
                "unknown identity field {name:?} (expected {})",
                Self::FIELDS.join(", ")
            ))),
        }
    }

    /// Sets the field `name` from 64 hex digits.
    pub fn set_hex(&mut self, name: &str, text: &str) -> Result<(), InvalidInput> {
        Self::check_field(name)?;
        let slot = match name {
            "tokenizer_hash" => &mut self.tokenizer_hash,
            _ => &mut self.chat_template_hash,
        };
        *slot = parse_hex_digest(text).map_err(|e| match e {
            HexError::Length(n) => InvalidInput(format!("{name} must be 64 hex digits, got {n}")),
            HexError::NotHex => InvalidInput(format!("{name} is not hex: {text:?}")),
        })?;
        Ok(())
    }
}

/// The identity of `session`'s cache as it is now, for a model whose content hash is
/// `model_hash`.
pub fn session_identity(
    session: &Session,
    model_hash: Digest,
    hashes: &IdentityHashes,
) -> CacheIdentity {
    let cache = session.cache();
    CacheIdentity::new(
        cache.shape(),
        cache.config(),
        IdentityInputs {
            model_hash,
            tokenizer_hash: hashes.tokenizer_hash,
            chat_template_hash: hashes.chat_template_hash,
            context_tokens: session.tokens().len() as u64,
            context_digest: context_digest(session.tokens(), cache.retired(), cache.gap()),
            runtime_build: runtime_build(),
        },
    )
    .with_layer_windows(cache.layer_windows())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hashes_are_set_by_name_from_hex() {
        let mut hashes = IdentityHashes::default();
        hashes.set_hex("tokenizer_hash", &"ab".repeat(32)).unwrap();
        assert_eq!(hashes.tokenizer_hash, [0xab; 32]);
        assert_eq!(hashes.chat_template_hash, [0; 32]);
        let mut err = |name: &str, text: &str| hashes.set_hex(name, text).unwrap_err().0;
        assert_eq!(
            err("model_hash", "00"),
            "unknown identity field \"model_hash\" (expected tokenizer_hash, chat_template_hash)"
        );
        assert_eq!(
            err("chat_template_hash", "abc"),
            "chat_template_hash must be 64 hex digits, got 3"
        );
        assert!(err("tokenizer_hash", &"zz".repeat(32)).starts_with("tokenizer_hash is not hex"));
    }
}
