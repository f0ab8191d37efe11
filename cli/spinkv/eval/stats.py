"""Metric math for `spinkv eval`: per-position comparisons of two logit streams and paired
bootstrap confidence intervals over positions. numpy only; everything in float64."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

DEFAULT_RESAMPLES = 1000
DEFAULT_SEED = 20261130
CONFIDENCE = 0.95
_BLOCK = 200  # resamples per vectorised block: bounds memory at depth


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """log-softmax over the last axis, computed in float64."""
    x = np.asarray(logits, dtype=np.float64)
    x = x - x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


def compare_rows(
    ref_logits: np.ndarray, arm_logits: np.ndarray, targets: Sequence[int]
) -> dict[str, np.ndarray]:
    """Per row of [T, vocab] logits (reference first): KL(p_ref || p_arm), top-1 agreement
    and each arm's negative log-likelihood of the row's target token."""
    lp_ref = log_softmax(ref_logits)
    lp_arm = log_softmax(arm_logits)
    rows = np.arange(lp_ref.shape[0])
    tgt = np.asarray(targets, dtype=np.int64)
    kld = np.maximum((np.exp(lp_ref) * (lp_ref - lp_arm)).sum(axis=-1), 0.0)
    return {
        "kld": kld,
        "top1": lp_ref.argmax(axis=-1) == lp_arm.argmax(axis=-1),
        "nll_ref": -lp_ref[rows, tgt],
        "nll_arm": -lp_arm[rows, tgt],
    }


COMPARE_BLOCK_ROWS = 64
"""Rows compared at once: float64 [rows, vocab] temporaries stay small at a 49k vocabulary."""


@dataclass
class PositionSeries:
    """Per-position metrics of one arm against the reference, in position order
    (position = index + start). kld is KL(p_ref || p_arm) in nats, nll_* the negative
    log-likelihoods of the next token."""

    start: int = 0
    kld: list[float] = field(default_factory=list)
    top1: list[bool] = field(default_factory=list)
    nll_ref: list[float] = field(default_factory=list)
    nll_arm: list[float] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.kld)

    def extend(
        self, ref_logits: np.ndarray, arm_logits: np.ndarray, targets: Sequence[int]
    ) -> None:
        """Compare the next rows of logits [T, vocab] (targets: the next token of each row)."""
        for lo in range(0, len(targets), COMPARE_BLOCK_ROWS):
            hi = lo + COMPARE_BLOCK_ROWS
            rows = compare_rows(ref_logits[lo:hi], arm_logits[lo:hi], targets[lo:hi])
            self.kld.extend(rows["kld"].tolist())
            self.top1.extend(rows["top1"].tolist())
            self.nll_ref.extend(rows["nll_ref"].tolist())
            self.nll_arm.extend(rows["nll_arm"].tolist())

    def arrays(self, skip: int = 0) -> dict[str, np.ndarray]:
        """The series from position `skip` on, as float64/bool arrays."""
        cut = max(skip - self.start, 0)
        return {
            "kld": np.asarray(self.kld[cut:], dtype=np.float64),
            "top1": np.asarray(self.top1[cut:], dtype=bool),
            "nll_ref": np.asarray(self.nll_ref[cut:], dtype=np.float64),
            "nll_arm": np.asarray(self.nll_arm[cut:], dtype=np.float64),
        }


def _statistics(
    kld: np.ndarray, top1: np.ndarray, nll_ref: np.ndarray, nll_arm: np.ndarray
) -> dict[str, np.ndarray]:
    """Each statistic for every row of [B, n] (or a single [n]) samples."""
    ppl_ref = np.exp(nll_ref.mean(axis=-1))
    ppl_arm = np.exp(nll_arm.mean(axis=-1))
    return {
        "kld_mean": kld.mean(axis=-1),
        "kld_p99": np.quantile(kld, 0.99, axis=-1),
        "top1": top1.mean(axis=-1),
        "ppl_ref": ppl_ref,
        "ppl": ppl_arm,
        "ppl_delta_pct": (ppl_arm / ppl_ref - 1.0) * 100.0,
    }


STATISTICS = ("kld_mean", "kld_p99", "top1", "ppl_ref", "ppl", "ppl_delta_pct")


def paired_bootstrap(
    series: dict[str, np.ndarray],
    *,
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = DEFAULT_SEED,
    confidence: float = CONFIDENCE,
) -> dict[str, dict[str, float]]:
    """Point estimate and percentile CI of every statistic.

    Positions are resampled jointly for both arms (the same index draws feed the reference's
    and the arm's figures), so ppl_delta_pct's interval is a paired one."""
    kld, top1 = series["kld"], series["top1"].astype(np.float64)
    nll_ref, nll_arm = series["nll_ref"], series["nll_arm"]
    n = kld.shape[0]
    if n == 0:
        raise ValueError("no positions to summarise")
    point = _statistics(kld, top1, nll_ref, nll_arm)
    rng = np.random.default_rng(seed)
    draws: dict[str, list[np.ndarray]] = {name: [] for name in STATISTICS}
    done = 0
    while done < resamples:
        b = min(_BLOCK, resamples - done)
        idx = rng.integers(0, n, size=(b, n))
        stats = _statistics(kld[idx], top1[idx], nll_ref[idx], nll_arm[idx])
        for name in STATISTICS:
            draws[name].append(stats[name])
        done += b
    alpha = (1.0 - confidence) / 2.0
    out: dict[str, dict[str, float]] = {}
    for name in STATISTICS:
        values = np.concatenate(draws[name]) if resamples else np.asarray([point[name]])
        lo, hi = np.quantile(values, [alpha, 1.0 - alpha])
        out[name] = {"value": float(point[name]), "lo": float(lo), "hi": float(hi)}
    return out


def bucket_means(values: Sequence[float], start: int, bucket: int) -> dict[str, list[float]]:
    """Mean of `values` per bucket of `bucket` positions: {"position": centres, "mean": ...}."""
    v = np.asarray(values, dtype=np.float64)
    centres: list[float] = []
    means: list[float] = []
    for lo in range(0, v.shape[0], bucket):
        chunk = v[lo : lo + bucket]
        centres.append(start + lo + (chunk.shape[0] - 1) / 2.0)
        means.append(float(chunk.mean()))
    return {"position": centres, "mean": means}
