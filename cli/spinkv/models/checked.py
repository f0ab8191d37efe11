"""Which store models passed the tokenizer and chat-template checks, so `spinkv models list`
parses a tokenizer.json again (about 90 ms for SmolLM2's 3.5 MB, after 100-200 ms to import
`tokenizers`) only when a file those checks read, or a library that reads them, has changed.

One hidden file in the store's models directory (`list` never takes it for a model):
{"format": 1, "libraries": {name: version}, "models": {resolved dir: [[file, size, mtime_ns]]}}.
Only passes are kept: a model that failed is checked again, so its reason is always current.
The record is a cache: unreadable, it is ignored; unwritable, it is not written.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

RECORD_FILE = ".spinkv-checked.json"
RECORD_FORMAT = 1
"""Bumped when the checks change, so earlier passes are not trusted."""
CHECKED_FILES = (
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "chat_template.jinja",
)
"""What loading the tokenizer and chat template reads (spinkv.tokenizer, spinkv.chat_template)."""
CHECKING_LIBRARIES = ("tokenizers", "jinja2")


def file_keys(model_dir: Path) -> list[list[Any]]:
    """[name, size, mtime_ns] of each checked file ([name, None, None] when it is absent)."""
    keys: list[list[Any]] = []
    for name in CHECKED_FILES:
        try:
            stat = (model_dir / name).stat()
        except OSError:
            keys.append([name, None, None])
            continue
        keys.append([name, stat.st_size, stat.st_mtime_ns])
    return keys


def library_versions() -> dict[str, str | None]:
    """Installed versions of the libraries the checks run (without importing them)."""
    from importlib.metadata import PackageNotFoundError, version

    versions: dict[str, str | None] = {}
    for name in CHECKING_LIBRARIES:
        try:
            versions[name] = version(name)
        except PackageNotFoundError:
            versions[name] = None
    return versions


class CheckedModels:
    """The passes recorded in `root` (a store's models directory)."""

    def __init__(self, root: Path) -> None:
        self.path = root / RECORD_FILE
        self.libraries = library_versions()
        self.passes: dict[str, list[list[Any]]] = {}
        self.seen: set[str] = set()
        self.changed = False
        self.writable = not (self.path.exists() or self.path.is_symlink())
        try:
            record = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError):
            return
        # Only a record of ours is ever replaced.
        self.writable = isinstance(record, dict) and "format" in record and self.path.is_file()
        if (
            isinstance(record, dict)
            and record.get("format") == RECORD_FORMAT
            and record.get("libraries") == self.libraries
            and isinstance(record.get("models"), dict)
        ):
            self.passes = record["models"]

    def passed(self, model_dir: Path, keys: list[list[Any]]) -> bool:
        """Whether model_dir passed with its checked files at `keys` (`file_keys` now)."""
        self.seen.add(str(model_dir))
        return self.passes.get(str(model_dir)) == keys

    def record_pass(self, model_dir: Path, keys: list[list[Any]]) -> None:
        """model_dir passed with its files at `keys` (taken before the checks read them, so a
        file changed meanwhile is checked again next time)."""
        self.passes[str(model_dir)] = keys
        self.changed = True

    def save(self) -> None:
        """Write the record, keeping only the directories asked about since it was read."""
        kept = {path: keys for path, keys in self.passes.items() if path in self.seen}
        if not self.writable or (not self.changed and kept.keys() == self.passes.keys()):
            return
        record = {"format": RECORD_FORMAT, "libraries": self.libraries, "models": kept}
        tmp = self.path.with_name(f"{RECORD_FILE}.{os.getpid()}.tmp")
        try:
            tmp.write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
            os.replace(tmp, self.path)
        except OSError:  # a read-only store: list stays correct, only slower
            tmp.unlink(missing_ok=True)
