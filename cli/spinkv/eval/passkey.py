"""Passkey retrieval prompts: a pass key hidden in a long haystack of real text (the licence
texts every Debian machine has), then a question about it: through the chat template, or for a
base model as plain text ending in the start of the answer."""

from __future__ import annotations

import os
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from spinkv.errors import InvalidInputError

LICENSE_DIR = Path("/usr/share/common-licenses")
DEFAULT_DEPTHS = (1000, 2000, 4000, 7000)
DEFAULT_POSITION = 0.5
ANSWER_TOKENS = 16
PREAMBLE = (
    "There is an important piece of information hidden inside a lot of irrelevant text. "
    "Find it and memorize it. I will quiz you about it.\n\n"
)
NEEDLE = "The pass key is {key}. Remember it. {key} is the pass key."
QUESTION = "What is the pass key?"
ANSWER_PRIMER = "The pass key is"
"""Ends a base model's prompt (no chat template): it completes text rather than answering."""


def haystack_text(directory: Path = LICENSE_DIR) -> str:
    """Every distinct text file in directory (symlinks and duplicates once), by name."""
    if not directory.is_dir():
        raise InvalidInputError(f"no haystack text: {directory} is not a directory")
    seen: set[str] = set()
    parts: list[str] = []
    for path in sorted(directory.iterdir()):
        real = os.path.realpath(path)
        if not path.is_file() or real in seen:
            continue
        seen.add(real)
        text = path.read_text(encoding="utf-8", errors="replace").strip()
        if text and text not in parts:
            parts.append(text)
    if not parts:
        raise InvalidInputError(f"no haystack text in {directory}")
    return "\n\n".join(parts)


def pass_key(depth: int, seed: int) -> str:
    """A five-digit key, fixed for (depth, seed)."""
    return str(random.Random(seed * 100_003 + depth).randint(10_000, 99_999))


def found(key: str, answer: str) -> bool:
    """Whether the key's digits appear in the answer (other characters ignored)."""
    digits = "".join(ch for ch in answer if ch.isdigit())
    return key in digits


def insert_needle(text: str, needle: str, position: float) -> str:
    """text with needle inserted at the first sentence or line end after `position` (0..1)
    of its length."""
    if not 0.0 <= position <= 1.0:
        raise InvalidInputError(f"passkey position {position} must be in [0, 1]")
    at = int(len(text) * position)
    ends = [i for i in (text.find(". ", at), text.find("\n", at)) if i >= 0]
    cut = min(ends) + 1 if ends else len(text)
    return f"{text[:cut].rstrip()} {needle} {text[cut:].lstrip()}".strip()


@dataclass(frozen=True)
class PasskeyPrompt:
    depth: int
    """Prompt length asked for, in tokens."""
    key: str
    token_ids: list[int]


def build_prompt(
    depth: int,
    key: str,
    *,
    haystack_ids: Sequence[int],
    detokenize: Callable[[Sequence[int]], str],
    prompt_ids: Callable[[str], list[int]],
    position: float = DEFAULT_POSITION,
) -> PasskeyPrompt:
    """The chat prompt of about `depth` tokens: preamble, haystack with the needle at
    `position`, question. prompt_ids renders a user message through the chat template and
    tokenizes it; the haystack is cut from haystack_ids to fit."""
    needle = NEEDLE.format(key=key)
    overhead = len(prompt_ids(f"{PREAMBLE}{needle}\n\n{QUESTION}"))
    budget = depth - overhead
    if budget <= 0:
        raise InvalidInputError(f"passkey depth {depth} is shorter than the prompt's frame")
    if budget > len(haystack_ids):
        raise InvalidInputError(
            f"passkey depth {depth} needs more haystack than the {len(haystack_ids)} tokens there"
        )
    hay = insert_needle(detokenize(haystack_ids[:budget]), needle, position)
    return PasskeyPrompt(depth, key, prompt_ids(f"{PREAMBLE}{hay}\n\n{QUESTION}"))
