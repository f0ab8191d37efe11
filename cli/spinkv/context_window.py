"""Which part of a long conversation a sliding chat feeds when it builds its cache from nothing.

A conversation longer than the context cannot be held whole: prefilling all of it only computes
tokens that slide out again. Like llama.cpp's server and ollama, the chat then feeds the system
prompt and the newest whole turns that fit, leaving room for the reply, and renders from that
message on while the cache lasts (so each later rendering extends what the cache holds).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

REPLY_ROOM_SHARE = 4
"""The room left for the reply is max_tokens, at most 1/REPLY_ROOM_SHARE of the context."""


def reply_room(limit: int, max_tokens: object) -> int:
    """Tokens kept free for the reply: max_tokens (when it is a valid count), at most a quarter
    of the context."""
    most = limit // REPLY_ROOM_SHARE
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        return most  # the turn itself refuses it, with the reason
    return min(max_tokens, most)


def prompt_budget(limit: int, max_tokens: object) -> int:
    """The most prompt tokens a chat feeds when it rebuilds its cache."""
    return limit - reply_room(limit, max_tokens)


def turn_starts(history: Sequence[Mapping[str, str]], first: int) -> list[int]:
    """Where a fed conversation may start, from `first` on: `first` itself, each user message
    after it (so user/assistant turns stay whole) and the end (no earlier message at all)."""
    end = len(history)
    later = [i for i in range(first + 1, end) if history[i].get("role") == "user"]
    return [first, *later, end] if first < end else [end]


def first_fitting(starts: Sequence[int], fits: Callable[[int], bool]) -> int:
    """The earliest start whose rendering fits, by bisection (renderings only shrink as the
    start moves on); the last start when none does (the caller checked that it fits the
    context)."""
    low, high = 0, len(starts) - 1
    while low < high:
        middle = (low + high) // 2
        if fits(starts[middle]):
            high = middle
        else:
            low = middle + 1
    return starts[low]
