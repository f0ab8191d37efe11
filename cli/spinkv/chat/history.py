"""Line editing and a persistent input history for the chat REPL (stdlib readline)."""

from __future__ import annotations

import contextlib
from pathlib import Path
from types import ModuleType

HISTORY_LENGTH = 1000


def history_path() -> Path:
    from spinkv.models.store import store_dir

    return store_dir() / "chat_history"


def _readline() -> ModuleType | None:
    try:
        import readline
    except ImportError:  # e.g. Windows without pyreadline
        return None
    return readline


class LineHistory:
    """Loads the history on enter and saves it on exit; a missing or unwritable history
    file only costs the history, never the chat."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self.readline = _readline() if path is not None else None

    @classmethod
    def for_chat(cls, *, enabled: bool) -> LineHistory:
        return cls(history_path() if enabled else None)

    def __enter__(self) -> LineHistory:
        if self.readline is not None and self.path is not None:
            self.readline.set_history_length(HISTORY_LENGTH)
            with contextlib.suppress(OSError):
                self.readline.read_history_file(self.path)
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self.readline is None or self.path is None:
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.readline.write_history_file(self.path)
        except OSError:
            pass
