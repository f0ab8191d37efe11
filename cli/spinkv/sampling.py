"""Sampling settings: checked and executed by the Rust sampler."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from spinkv import _native


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
        # The runtime's sampler owns the rules (types, ranges): building one checks them all.
        self.to_native()

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_native(self) -> _native.Sampler:
        """A fresh Rust sampler (its random state starts from `seed`)."""
        from spinkv import _native

        return _native.Sampler(
            temperature=self.temperature,
            top_k=self.top_k,
            top_p=self.top_p,
            min_p=self.min_p,
            repetition_penalty=self.repetition_penalty,
            repeat_last_n=self.repeat_last_n,
            seed=self.seed,
        )


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
