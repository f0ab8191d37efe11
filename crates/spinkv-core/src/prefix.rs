//! Prefix reuse: a new prompt keeps the cached tokens it starts with and computes only the
//! rest.

use spinkv_model::Session;

use crate::error::InvalidInput;

/// Length of the common prefix of `a` and `b`.
pub fn common_prefix_len(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// How many `cached` tokens a new `prompt` can keep: the common prefix, minus one token when
/// the prompt is entirely cached — its last token is always computed again, so that the logits
/// the reply starts from belong to this prompt.
pub fn reusable_prefix(cached: &[u32], prompt: &[u32]) -> Result<usize, InvalidInput> {
    if prompt.is_empty() {
        return Err(InvalidInput("empty prompt".to_string()));
    }
    Ok(common_prefix_len(cached, prompt).min(prompt.len() - 1))
}

/// Truncates `session` to the prefix `prompt` can reuse and returns the tokens kept. This can
/// be fewer than [`reusable_prefix`] says after a sliding-window retirement (the session then
/// keeps what it can).
pub fn reuse_prefix(session: &mut Session, prompt: &[u32]) -> Result<usize, InvalidInput> {
    let keep = reusable_prefix(session.tokens(), prompt)?;
    if keep < session.len() {
        session.truncate(keep);
    }
    Ok(session.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_last_prompt_token_is_always_recomputed() {
        assert_eq!(reusable_prefix(&[1, 2, 3], &[1, 2, 4, 5]), Ok(2));
        assert_eq!(reusable_prefix(&[1, 2, 3], &[1, 2, 3]), Ok(2));
        assert_eq!(reusable_prefix(&[1, 2, 3, 4], &[1, 2]), Ok(1));
        assert_eq!(reusable_prefix(&[], &[7]), Ok(0));
        assert_eq!(reusable_prefix(&[9], &[7, 8]), Ok(0));
        assert!(reusable_prefix(&[1], &[]).is_err());
        assert_eq!(common_prefix_len(&[1, 2], &[1, 2, 3]), 2);
    }
}
