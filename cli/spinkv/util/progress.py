"""Progress of long steps (download, dequantize, write) without tying the library to a UI.

Library code reports to `current()`: a no-op unless a caller installed a reporter with
`reporting(...)`. The CLI installs a rich progress bar on a terminal; the API records which
models an import added to the store (`LoadedModel.import_ms`).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path


class Steps:
    """The reporter interface; this base class ignores everything."""

    def start(self, label: str, total: int | None = None) -> None:
        """A new step: total units (None: unknown, a spinner)."""

    def advance(self, units: int = 1) -> None:
        """Units of the current step done."""

    def finish(self) -> None:
        """The current step is over."""

    def imported(self, name: str, path: Path, size_bytes: int, seconds: float) -> None:
        """A model was added to (or refreshed in) the store."""


class Tee(Steps):
    """Passes every report to two reporters."""

    def __init__(self, first: Steps, second: Steps) -> None:
        self.first, self.second = first, second

    def start(self, label: str, total: int | None = None) -> None:
        self.first.start(label, total)
        self.second.start(label, total)

    def advance(self, units: int = 1) -> None:
        self.first.advance(units)
        self.second.advance(units)

    def finish(self) -> None:
        self.first.finish()
        self.second.finish()

    def imported(self, name: str, path: Path, size_bytes: int, seconds: float) -> None:
        self.first.imported(name, path, size_bytes, seconds)
        self.second.imported(name, path, size_bytes, seconds)


class ImportLog(Steps):
    """Remembers the imports it hears of."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.models: list[tuple[str, Path, int]] = []

    def imported(self, name: str, path: Path, size_bytes: int, seconds: float) -> None:
        self.seconds += seconds
        self.models.append((name, path, size_bytes))


_IGNORE = Steps()
_current: ContextVar[Steps | None] = ContextVar("spinkv_progress", default=None)


def current() -> Steps:
    return _current.get() or _IGNORE


@contextmanager
def reporting(steps: Steps) -> Iterator[Steps]:
    """Make steps the reporter for this context (added to the one already installed)."""
    outer = _current.get()
    token = _current.set(steps if outer is None else Tee(outer, steps))
    try:
        yield steps
    finally:
        _current.reset(token)
