//! Which messages a sliding chat feeds when it builds its cache from nothing, as
//! `spinkv.context_window` decides it for the terminal's chat.
//!
//! A conversation longer than the context cannot be held whole: the chat then feeds the system
//! prompt and the newest whole user/assistant turns that fit, leaving room for the reply
//! (max_tokens, at most a quarter of the context), and renders from that message on while the
//! cache lasts. Pure (no runtime, no wasm): compiled and unit-tested on every target.

/// The room left for the reply is max_tokens, at most 1/REPLY_ROOM_SHARE of the context.
pub const REPLY_ROOM_SHARE: usize = 4;

/// The most prompt tokens a chat feeds when it rebuilds its cache: the context minus the room
/// for the reply.
pub fn prompt_budget(limit: usize, max_tokens: usize) -> usize {
    limit - max_tokens.min(limit / REPLY_ROOM_SHARE)
}

/// Where a fed conversation may start, from `first` on, given the roles of the messages after
/// the system prompt (the last one is the new message, always fed): `first` itself, each later
/// user message (so user/assistant turns stay whole) and the last message. Empty only when
/// there are no messages.
pub fn turn_starts(roles: &[&str], first: usize) -> Vec<usize> {
    let Some(last) = roles.len().checked_sub(1) else {
        return Vec::new();
    };
    let first = first.min(last);
    let mut starts = vec![first];
    starts.extend((first + 1..last).filter(|&i| roles.get(i) == Some(&"user")));
    if first < last {
        starts.push(last);
    }
    starts
}

/// The earliest of `starts` whose rendering fits, by bisection (renderings only shrink as the
/// start moves on); the last start when none does. None only for no starts at all.
pub fn first_fitting(starts: &[usize], mut fits: impl FnMut(usize) -> bool) -> Option<usize> {
    let (mut low, mut high) = (0, starts.len().checked_sub(1)?);
    while low < high {
        let middle = (low + high) / 2;
        if starts.get(middle).is_some_and(|&s| fits(s)) {
            high = middle;
        } else {
            low = middle + 1;
        }
    }
    starts.get(low).copied()
}

/// The first message (among those after the system prompt, with `roles`) a rebuilt cache is fed
/// from: the earliest start from `first` on whose rendering, `tokens_from(start)` long (None:
/// it cannot be rendered, as good as too long), holds at most `budget` tokens; the last message
/// when none does.
pub fn fitting_start(
    roles: &[&str],
    first: usize,
    budget: usize,
    mut tokens_from: impl FnMut(usize) -> Option<usize>,
) -> usize {
    let starts = turn_starts(roles, first);
    first_fitting(&starts, |start| {
        tokens_from(start).is_some_and(|n| n <= budget)
    })
    .unwrap_or(first)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reply_keeps_max_tokens_at_most_a_quarter_of_the_context() {
        assert_eq!(prompt_budget(256, 32), 224);
        assert_eq!(prompt_budget(256, 512), 192);
        assert_eq!(prompt_budget(256, 64), 192);
        assert_eq!(prompt_budget(3, 1), 3);
    }

    #[test]
    fn turns_start_at_user_messages_and_the_new_message_always_stays() {
        let roles = ["user", "assistant", "user", "assistant", "user"];
        assert_eq!(turn_starts(&roles, 0), vec![0, 2, 4]);
        assert_eq!(turn_starts(&roles, 2), vec![2, 4]);
        assert_eq!(turn_starts(&roles, 4), vec![4]);
        // A start past the messages (a conversation replaced under the engine) is the last.
        assert_eq!(turn_starts(&roles, 9), vec![4]);
        // An assistant message never starts a fed conversation, but `first` does as it is.
        assert_eq!(
            turn_starts(&["assistant", "user", "user"], 0),
            vec![0, 1, 2]
        );
        assert_eq!(turn_starts(&["user"], 0), vec![0]);
        assert!(turn_starts(&[], 0).is_empty());
    }

    #[test]
    fn bisection_finds_the_earliest_start_that_fits() {
        let starts = [0, 2, 4, 6, 8];
        for cut in 0..=starts.len() {
            let mut calls = 0;
            let got = first_fitting(&starts, |s| {
                calls += 1;
                starts
                    .iter()
                    .position(|&x| x == s)
                    .is_some_and(|i| i >= cut)
            });
            // None fit: the last start.
            let want = starts[cut.min(starts.len() - 1)];
            assert_eq!(got, Some(want), "cut {cut}");
            assert!(calls <= 3, "{calls} renderings for 5 starts");
        }
        assert_eq!(first_fitting(&[], |_| true), None);
        assert_eq!(first_fitting(&[7], |_| false), Some(7));
    }

    #[test]
    fn the_newest_whole_turns_that_fit_the_budget_are_fed() {
        // system 20 tokens, each message 30: rendering from `start` is 20 + 30 per message.
        let roles = [
            "user",
            "assistant",
            "user",
            "assistant",
            "user",
            "assistant",
            "user",
        ];
        let tokens = |start: usize| Some(20 + 30 * (roles.len() - start));
        assert_eq!(fitting_start(&roles, 0, 1000, tokens), 0);
        assert_eq!(fitting_start(&roles, 0, 140, tokens), 4); // 110 tokens: two turns
        assert_eq!(fitting_start(&roles, 0, 139, tokens), 4);
        assert_eq!(fitting_start(&roles, 0, 109, tokens), 6); // only the new message
        assert_eq!(fitting_start(&roles, 0, 10, tokens), 6); // nothing fits: the caller refuses
        assert_eq!(fitting_start(&roles, 2, 1000, tokens), 2); // never before `first`
                                                               // A rendering that fails (the template's output bound) counts as too long.
        let failing = |start: usize| (start >= 4).then(|| 20 + 30 * (roles.len() - start));
        assert_eq!(fitting_start(&roles, 0, 1000, failing), 4);
        assert_eq!(fitting_start(&[], 0, 1000, tokens), 0);
    }
}
