"""Statistics of the suite: paired bootstrap intervals over units (prompts or texts), paired
sign-flip permutation tests, Holm's step-down correction. numpy only, float64."""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

EXACT_LIMIT = 16
"""Up to this many units the permutation test enumerates all 2^n sign flips (exact)."""
_TOL = 1e-12


def bootstrap_mean(
    values: Sequence[float], *, resamples: int, seed: int, confidence: float = 0.95
) -> tuple[float, float, float]:
    """Mean of the units and its percentile bootstrap interval (units resampled)."""
    v = np.asarray(values, dtype=np.float64)
    if v.size == 0:
        raise ValueError("no units to summarise")
    mean = float(v.mean())
    if resamples == 0 or v.size == 1:
        return mean, mean, mean
    rng = np.random.default_rng(seed)
    means = v[rng.integers(0, v.size, size=(resamples, v.size))].mean(axis=1)
    tail = (1.0 - confidence) / 2.0
    lo, hi = np.quantile(means, [tail, 1.0 - tail])
    return mean, float(min(lo, mean)), float(max(hi, mean))


def _flip_means(d: np.ndarray, resamples: int, seed: int) -> np.ndarray:
    """Means of d under sign flips: all 2^n when n <= EXACT_LIMIT, else `resamples` random."""
    n = d.size
    if n <= EXACT_LIMIT:
        signs = np.array(list(itertools.product((1.0, -1.0), repeat=n)), dtype=np.float64)
    else:
        rng = np.random.default_rng(seed)
        signs = rng.choice(np.array([1.0, -1.0]), size=(resamples, n))
    return (signs * d).mean(axis=1)


def sign_flip_p(
    differences: Sequence[float],
    *,
    alternative: str = "two-sided",
    resamples: int = 20000,
    seed: int = 0,
) -> float:
    """Paired permutation test of H0 "the paired differences are symmetric about 0": each
    unit's difference keeps or flips its sign. alternative "greater" tests mean > 0,
    "two-sided" |mean| > 0. Exact up to EXACT_LIMIT units; else Monte Carlo with the
    (1 + hits) / (1 + resamples) estimate, never 0."""
    d = np.asarray(differences, dtype=np.float64)
    if d.size == 0:
        raise ValueError("no units to test")
    observed = float(d.mean())
    means = _flip_means(d, resamples, seed)
    if alternative == "greater":
        hits = int(np.sum(means >= observed - _TOL))
    elif alternative == "two-sided":
        hits = int(np.sum(np.abs(means) >= abs(observed) - _TOL))
    else:
        raise ValueError(f"unknown alternative {alternative!r}")
    if d.size <= EXACT_LIMIT:
        return hits / means.size
    return (1 + hits) / (1 + means.size)


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values, in the input order."""
    m = len(p_values)
    order = sorted(range(m), key=lambda i: p_values[i])
    adjusted = [0.0] * m
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p_values[i]))
        adjusted[i] = running
    return adjusted


@dataclass(frozen=True)
class Interval:
    value: float
    lo: float
    hi: float

    def to_dict(self) -> dict[str, float]:
        return {"value": self.value, "lo": self.lo, "hi": self.hi}


def interval(values: Sequence[float], resamples: int, seed: int, confidence: float) -> Interval:
    return Interval(*bootstrap_mean(values, resamples=resamples, seed=seed, confidence=confidence))


def finite(x: float) -> float:
    """x, or 0.0 for NaN/inf (a JSON-safe figure)."""
    return x if math.isfinite(x) else 0.0
