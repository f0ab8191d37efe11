"""Sampling settings: validated in Python, executed by the Rust sampler."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from spinkv.errors import InvalidInputError

if TYPE_CHECKING:
    from spinkv import _native

MAX_SEED = 2**64 - 1
MAX_COUNT = 2**31 - 1
"""Largest top_k / repeat_last_n (both are far beyond any vocabulary or context)."""


@dataclass(frozen=True)
class SamplingParams:
    """How the next token is chosen. The defaults are greedy decoding (reproducible).

    temperature 0 means greedy; top_k 0, top_p 1, min_p 0 and repetition_penalty 1 each
    switch their filter off. repeat_last_n is how many recent tokens the repetition penalty
    looks at. seed makes sampling at temperature > 0 deterministic.
    """

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    repeat_last_n: int = 64
    seed: int | None = None

    def __post_init__(self) -> None:
        _check_finite("temperature", self.temperature)
        if self.temperature < 0:
            raise _invalid("temperature", self.temperature, "must be >= 0 (0 means greedy)")
        _check_int("top_k", self.top_k)
        if not 0 <= self.top_k <= MAX_COUNT:
            raise _invalid("top_k", self.top_k, "must be in [0, 2**31 - 1] (0 switches it off)")
        _check_finite("top_p", self.top_p)
        if not 0 < self.top_p <= 1:
            raise _invalid("top_p", self.top_p, "must be in (0, 1] (1 switches it off)")
        _check_finite("min_p", self.min_p)
        if not 0 <= self.min_p < 1:
            raise _invalid("min_p", self.min_p, "must be in [0, 1) (0 switches it off)")
        _check_finite("repetition_penalty", self.repetition_penalty)
        if self.repetition_penalty <= 0:
            raise _invalid(
                "repetition_penalty", self.repetition_penalty, "must be > 0 (1 switches it off)"
            )
        _check_int("repeat_last_n", self.repeat_last_n)
        if not 0 <= self.repeat_last_n <= MAX_COUNT:
            raise _invalid("repeat_last_n", self.repeat_last_n, "must be in [0, 2**31 - 1]")
        if self.seed is not None:
            _check_int("seed", self.seed)
            if not 0 <= self.seed <= MAX_SEED:
                raise _invalid("seed", self.seed, "must be in [0, 2**64 - 1]")

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_native(self) -> _native.Sampler:
        """A fresh Rust sampler (its random state starts from `seed`)."""
        from spinkv import _native

        return _native.Sampler(
            temperature=float(self.temperature),
            top_k=int(self.top_k),
            top_p=float(self.top_p),
            min_p=float(self.min_p),
            repetition_penalty=float(self.repetition_penalty),
            repeat_last_n=int(self.repeat_last_n),
            seed=self.seed,
        )


def _invalid(name: str, value: object, rule: str) -> InvalidInputError:
    return InvalidInputError(f"invalid {name} {value!r}: {rule}")


def _check_finite(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _invalid(name, value, "must be a number")
    if not math.isfinite(value):
        raise _invalid(name, value, "must be a finite number")


def _check_int(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise _invalid(name, value, "must be an integer")


CHAT_DEFAULTS = SamplingParams(
    temperature=0.8, top_k=40, top_p=0.9, min_p=0.0, repetition_penalty=1.1, repeat_last_n=64
)
"""What `spinkv run` and `spinkv chat` sample with unless told otherwise: ollama's defaults.
Greedy decoding without a repetition penalty loops on ordinary questions with small models
(benches/sampling_loops.py measures how often; README "Sampling")."""


def sampling_with(given: dict[str, Any], base: SamplingParams = CHAT_DEFAULTS) -> SamplingParams:
    """base overridden by the settings in given (None values are ignored). A temperature of
    0 asks for exact greedy decoding: then the repetition penalty is off unless given too."""
    chosen = {key: value for key, value in given.items() if value is not None}
    if chosen.get("temperature") == 0 and "repetition_penalty" not in chosen:
        chosen["repetition_penalty"] = 1.0
    return SamplingParams(**{**base.to_dict(), **chosen})
