"""How one reply compares with fp16's reply to the same prompt, decoding and seed: token
agreement, first divergence, chrF (sacrebleu), exact match, same stop."""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from typing import Any

from spinkv.errors import UnsupportedError
from spinkv.generation import common_prefix_length

INSTALL_HINT = "the eval suite needs sacrebleu for chrF: pip install 'spinkv[eval]' (or sacrebleu)"


def require_sacrebleu() -> None:
    """One clear error before a long run if chrF cannot be computed."""
    try:
        import sacrebleu  # noqa: F401
    except ImportError as exc:
        raise UnsupportedError(INSTALL_HINT) from exc


@lru_cache(maxsize=1)
def _chrf() -> Any:
    require_sacrebleu()
    from sacrebleu.metrics import CHRF

    return CHRF()  # chrF2: character 6-grams, beta 2 (sacrebleu's defaults)


def chrf(hypothesis: str, reference: str) -> float:
    """sacrebleu's sentence chrF (0..100) of hypothesis against reference; 100 when equal."""
    if hypothesis == reference:
        return 100.0
    return float(_chrf().sentence_score(hypothesis, [reference]).score)


def reseed_floor(texts: Sequence[str]) -> float:
    """Mean chrF between fp16 replies with different seeds (every ordered pair): how much a
    reply changes from sampling alone."""
    pairs = [chrf(a, b) for i, a in enumerate(texts) for j, b in enumerate(texts) if i != j]
    if not pairs:
        raise ValueError("the reseed floor needs at least two sampled replies")
    return sum(pairs) / len(pairs)


def compare(
    ref_tokens: Sequence[int],
    arm_tokens: Sequence[int],
    ref_text: str,
    arm_text: str,
) -> dict[str, Any]:
    """Token agreement (common prefix / longer reply), first divergence (None if identical),
    chrF against fp16's text."""
    agree = common_prefix_length(ref_tokens, arm_tokens)
    identical = list(ref_tokens) == list(arm_tokens)
    longest = max(len(ref_tokens), len(arm_tokens))
    return {
        "agree_tokens": agree,
        "identical": identical,
        "agreement": 1.0 if longest == 0 else agree / longest,
        "first_divergence": None if identical else agree,
        "chrf": chrf(arm_text, ref_text),
    }
