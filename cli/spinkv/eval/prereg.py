"""The suite's preregistration (preregistration.toml): ship metrics, budgets, alpha, the Holm
family and the suite tiers, read and checked once; a bad file is one InvalidInputError line."""

from __future__ import annotations

import hashlib
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from spinkv.errors import InvalidInputError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python < 3.11
    import tomli as tomllib

DEFAULT_PATH = Path(__file__).with_name("preregistration.toml")
RULES = ("reseed_bar", "min_delta", "min", "max")
TIER_KEYS = (
    "prompts_per_family",
    "open_tokens",
    "answer_tokens",
    "corpus_tokens",
    "corpus_skip",
    "corpus_texts",
    "depth_bucket",
)


@dataclass(frozen=True)
class Rule:
    """One budget: `metric` ("family.metric"), its kind and its number.

    reseed_bar: chrF vs fp16 >= floor + value * (100 - floor) (value = bar_fraction);
    min_delta: arm - fp16 >= value; min: arm >= value; max: arm <= value."""

    metric: str
    kind: str
    value: float

    def describe(self) -> str:
        if self.kind == "reseed_bar":
            return f">= reseed floor + {self.value:g} x (100 - floor)"
        if self.kind == "min_delta":
            return f"arm - fp16 >= {self.value:+g}"
        return f"{'>=' if self.kind == 'min' else '<='} {self.value:g}"


@dataclass(frozen=True)
class Tier:
    name: str
    prompts_per_family: int
    sampled_seeds: tuple[int, ...]
    open_tokens: int
    answer_tokens: int
    corpus_tokens: int
    corpus_skip: int
    corpus_texts: int
    depth_bucket: int


@dataclass(frozen=True)
class Preregistration:
    path: Path
    sha256: str
    version: int
    written: str
    reference: str
    alpha: float
    confidence: float
    bootstrap_resamples: int
    permutation_resamples: int
    seed: int
    holm_family: tuple[str, ...]
    sampling: dict[str, float]
    budgets: dict[str, Rule]
    tiers: dict[str, Tier]

    def tier(self, name: str) -> Tier:
        if name not in self.tiers:
            raise InvalidInputError(
                f"unknown suite tier {name!r}: choose from {', '.join(sorted(self.tiers))}"
            )
        return self.tiers[name]

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": str(self.path),
            "sha256": self.sha256,
            "version": self.version,
            "written": self.written,
            "alpha": self.alpha,
            "holm_family": list(self.holm_family),
            "budgets": {m: {"rule": r.kind, "value": r.value} for m, r in self.budgets.items()},
        }


def _fail(path: Path, message: str) -> InvalidInputError:
    return InvalidInputError(f"preregistration {path}: {message}")


def _number(path: Path, table: dict[str, Any], key: str, where: str) -> float:
    value = table.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise _fail(path, f"{where}.{key} must be a number, got {value!r}")
    return float(value)


def _count(path: Path, table: dict[str, Any], key: str, where: str, low: int = 1) -> int:
    value = table.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise _fail(path, f"{where}.{key} must be an integer >= {low}, got {value!r}")
    return value


def _table(path: Path, data: dict[str, Any], key: str) -> dict[str, Any]:
    value = data.get(key)
    if not isinstance(value, dict):
        raise _fail(path, f"missing [{key}] table")
    return value


def _rule(path: Path, metric: str, table: Any) -> Rule:
    if not isinstance(table, dict):
        raise _fail(path, f"budgets.{metric} must be a table")
    if metric.count(".") != 1:
        raise _fail(path, f"budget name {metric!r} must be family.metric")
    kind = table.get("rule")
    if kind not in RULES:
        raise _fail(path, f"budgets.{metric}.rule must be one of {', '.join(RULES)}, got {kind!r}")
    key = "bar_fraction" if kind == "reseed_bar" else "value"
    value = _number(path, table, key, f"budgets.{metric}")
    if kind == "reseed_bar" and not 0.0 <= value <= 1.0:
        raise _fail(path, f"budgets.{metric}.bar_fraction must be in [0, 1], got {value:g}")
    return Rule(metric, kind, value)


def _tier(path: Path, name: str, table: Any) -> Tier:
    if not isinstance(table, dict):
        raise _fail(path, f"tiers.{name} must be a table")
    where = f"tiers.{name}"
    counts = {
        key: _count(path, table, key, where, low=0 if key == "corpus_texts" else 1)
        for key in TIER_KEYS
    }
    seeds = table.get("sampled_seeds")
    if (
        not isinstance(seeds, list)
        or len(seeds) < 2
        or any(isinstance(s, bool) or not isinstance(s, int) or s < 0 for s in seeds)
        or len(set(seeds)) != len(seeds)
    ):
        raise _fail(path, f"{where}.sampled_seeds must list at least 2 distinct seeds >= 0")
    if counts["corpus_skip"] >= counts["corpus_tokens"] - 1:
        raise _fail(path, f"{where}.corpus_skip must be below corpus_tokens - 1")
    return Tier(name=name, sampled_seeds=tuple(seeds), **counts)


def load(path: Path | None = None) -> Preregistration:
    """Read and check a preregistration file (default: the one shipped with spinkv)."""
    path = Path(path) if path is not None else DEFAULT_PATH
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise InvalidInputError(f"cannot read preregistration {path}: {exc.strerror}") from exc
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise _fail(path, f"not valid TOML ({first})") from exc
    version = _count(path, data, "version", "top level")
    written = data.get("written")
    if not isinstance(written, str) or not written:
        raise _fail(path, "written must be the date the file was written")
    reference = data.get("reference")
    if reference != "fp16":
        raise _fail(path, f'reference must be "fp16", got {reference!r}')
    st = _table(path, data, "statistics")
    alpha = _number(path, st, "alpha", "statistics")
    confidence = _number(path, st, "confidence", "statistics")
    if not 0.0 < alpha < 0.5:
        raise _fail(path, f"statistics.alpha must be in (0, 0.5), got {alpha:g}")
    if not 0.5 < confidence < 1.0:
        raise _fail(path, f"statistics.confidence must be in (0.5, 1), got {confidence:g}")
    budgets_table = _table(path, data, "budgets")
    budgets = {metric: _rule(path, metric, t) for metric, t in budgets_table.items()}
    family = st.get("holm_family")
    if not isinstance(family, list) or not family or not all(isinstance(m, str) for m in family):
        raise _fail(path, "statistics.holm_family must be a non-empty list of metric names")
    missing = [m for m in family if m not in budgets]
    if missing:
        raise _fail(path, f"holm_family names metrics without a budget: {', '.join(missing)}")
    if len(set(family)) != len(family):
        raise _fail(path, "statistics.holm_family lists a metric twice")
    dec = _table(path, data, "decoding")
    sampling = {
        "temperature": _number(path, dec, "temperature", "decoding"),
        "top_k": float(_count(path, dec, "top_k", "decoding", low=0)),
        "top_p": _number(path, dec, "top_p", "decoding"),
        "repetition_penalty": _number(path, dec, "repetition_penalty", "decoding"),
        "repeat_last_n": float(_count(path, dec, "repeat_last_n", "decoding", low=0)),
    }
    if sampling["temperature"] <= 0:
        raise _fail(path, "decoding.temperature must be > 0 (greedy runs anyway)")
    tiers_table = _table(path, data, "tiers")
    tiers = {name: _tier(path, name, t) for name, t in tiers_table.items()}
    if not tiers:
        raise _fail(path, "[tiers] defines no tier")
    return Preregistration(
        path=path,
        sha256=hashlib.sha256(raw).hexdigest(),
        version=version,
        written=written,
        reference=reference,
        alpha=alpha,
        confidence=confidence,
        bootstrap_resamples=_count(path, st, "bootstrap_resamples", "statistics"),
        permutation_resamples=_count(path, st, "permutation_resamples", "statistics"),
        seed=_count(path, st, "seed", "statistics", low=0),
        holm_family=tuple(family),
        sampling=sampling,
        budgets=budgets,
        tiers=tiers,
    )
