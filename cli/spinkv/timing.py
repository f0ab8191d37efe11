"""Per-phase timings of one generation, measured around each native call."""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from typing import Any


def _rate(tokens: int, ms: float) -> float | None:
    return tokens / (ms / 1000.0) if tokens > 0 and ms > 0 else None


@dataclass
class GenerationTimings:
    """Wall-clock milliseconds per phase of one reply.

    import_ms is the time `load` spent adding the model to the store (fetch, dequantize,
    write), 0 when it was already there.

    prefill_tokens counts the prompt tokens actually computed (cached ones are not);
    decode_tokens counts single-token forward passes; first_token_ms runs from the start
    of the turn (after tokenizing) to the first sampled token. attention/matmul/other come
    from the runtime's own timers and are filled only when available.
    """

    load_ms: float = 0.0
    import_ms: float = 0.0
    tokenize_ms: float = 0.0
    prefill_tokens: int = 0
    prefill_ms: float = 0.0
    first_token_ms: float | None = None
    decode_tokens: int = 0
    decode_ms: float = 0.0
    sampling_ms: float = 0.0
    isa: str = ""
    threads: int = 0
    attention_ms: float | None = None
    matmul_ms: float | None = None
    other_ms: float | None = None

    @property
    def prefill_tok_per_s(self) -> float | None:
        return _rate(self.prefill_tokens, self.prefill_ms)

    @property
    def decode_tok_per_s(self) -> float | None:
        return _rate(self.decode_tokens, self.decode_ms)

    def add_native_breakdown(self, native: Mapping[str, Any]) -> None:
        """Copy attention / matmul / other time from the runtime's `Session.timings()`."""
        for key in ("attention_ms", "matmul_ms", "other_ms"):
            value = native.get(key)
            if value is not None:
                setattr(self, key, float(value))

    def to_dict(self) -> dict[str, Any]:
        record = asdict(self)
        record["prefill_tok_per_s"] = self.prefill_tok_per_s
        record["decode_tok_per_s"] = self.decode_tok_per_s
        return record


class Stopwatch:
    """Accumulates elapsed milliseconds into a timings field: `with watch.phase("decode_ms")`."""

    def __init__(self, timings: GenerationTimings) -> None:
        self.timings = timings
        self.started = time.perf_counter()

    def elapsed_ms(self) -> float:
        return (time.perf_counter() - self.started) * 1000.0

    @contextmanager
    def phase(self, field: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            elapsed = (time.perf_counter() - start) * 1000.0
            setattr(self.timings, field, getattr(self.timings, field) + elapsed)
