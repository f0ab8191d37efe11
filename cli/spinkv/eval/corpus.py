"""The evaluation corpus: real texts every machine of this kind has (Debian's licence texts,
docs, man pages, headers, tables, and Debian's Python 3.11 standard library), recorded by
path and SHA-256 so every figure names exactly what it was measured on.

`load_text` fails with one line when a text is missing or changed; `missing()` tells tests
which texts to skip. ".gz" files are read decompressed; the SHA-256 is the file's own bytes.
"""

from __future__ import annotations

import gzip
import hashlib
from dataclasses import dataclass
from pathlib import Path

from spinkv.errors import InvalidInputError

KINDS = ("legal", "prose", "technical", "code", "list", "table")


@dataclass(frozen=True)
class CorpusText:
    name: str
    kind: str
    path: Path
    sha256: str
    package: str
    """The Debian package that ships it."""
    held_out: bool = True
    """False for the text the default preset was first measured (and so tuned) on."""


def _t(name: str, kind: str, path: str, sha256: str, package: str, held_out: bool = True):
    return CorpusText(name, kind, Path(path), sha256, package, held_out)


TEXTS: tuple[CorpusText, ...] = (
    _t("gpl-3", "legal", "/usr/share/common-licenses/GPL-3",
       "3972dc9744f6499f0f9b2dbf76696f2ae7ad8af9b23dde66d6af86c9dfb36986", "base-files",
       held_out=False),
    _t("apache-2.0", "legal", "/usr/share/common-licenses/Apache-2.0",
       "cfc7749b96f63bd31c3c42b5c471bf756814053e847c10f3eb003417bc523d30", "base-files"),
    _t("mpl-2.0", "legal", "/usr/share/common-licenses/MPL-2.0",
       "fab3dd6bdab226f1c08630b1dd917e11fcb4ec5e1e020e2c16f83a0a13863e85", "base-files"),
    _t("bash-intro", "prose", "/usr/share/doc/bash/INTRO.gz",
       "68785f9dc6e6f27fe798494c74c7321859f5f04245f2efa3c16b675598829308", "bash"),
    _t("python-history", "prose", "/usr/lib/python3.11/LICENSE.txt",
       "3b2f81fe21d181c499c59a256c8e1968455d6689d269aa85373bfb6af41da3bf",
       "libpython3.11-stdlib"),
    _t("gcc-readme-bugs", "technical", "/usr/share/doc/gcc-12-base/README.Bugs",
       "5d652eaec6fe628b0322cb09181631aadb952cbb91c8c6a4160e1df582268bc5", "gcc-12"),
    _t("bash-man", "technical", "/usr/share/man/man1/bash.1.gz",
       "3ca7a67df55bd2f80a2de111f8d44df359f7a795573aaaadce09a52a22bcedeb", "bash"),
    _t("bash-posix", "list", "/usr/share/doc/bash/POSIX.gz",
       "38ef3774c98e9e1fe49d425a213b39e8d84d8dc6312863336d8a4987c7ccf7e3", "bash"),
    _t("textwrap-py", "code", "/usr/lib/python3.11/textwrap.py",
       "62867e40cdea6669b361f72af4d7daf0359f207c92cbeddfc7c7506397c1f31c",
       "libpython3.11-minimal"),
    _t("json-decoder-py", "code", "/usr/lib/python3.11/json/decoder.py",
       "9f02654649816145bc76f8c210a5fe3ba1de142d4d97a1c93105732e747c285b",
       "libpython3.11-stdlib"),
    _t("stdio-h", "code", "/usr/include/stdio.h",
       "cf8eec642c164a95d6ffcdbea90db9e277c204532989492b0e9c0b4f55659d57", "libc6-dev"),
    _t("services", "table", "/etc/services",
       "f6183055fd949f9c53d49ee620f85d0150123ea691d25ed1bba0c641b4ee2f48", "netbase"),
    _t("zone1970-tab", "table", "/usr/share/zoneinfo/zone1970.tab",
       "57194e43b001b8f832987b21b82953d997aeeaebeb53a8520140bc12d7d8cfcc", "tzdata"),
    _t("iso3166-tab", "table", "/usr/share/zoneinfo/iso3166.tab",
       "a01a5d158f31d46ad8e6f8cc2a06c641810682a9397d460320f68d5421b65e71", "tzdata"),
)  # fmt: skip

BY_NAME = {t.name: t for t in TEXTS}


def sha256_of(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def problem(entry: CorpusText) -> str | None:
    """Why the text cannot be used (one line), or None when it is there and unchanged."""
    if not entry.path.is_file():
        return f"corpus text {entry.name} is missing: {entry.path} (Debian package {entry.package})"
    actual = sha256_of(entry.path)
    if actual != entry.sha256:
        return (
            f"corpus text {entry.name} changed: {entry.path} has SHA-256 {actual[:12]}..., "
            f"recorded {entry.sha256[:12]}..."
        )
    return None


def load_text(entry: CorpusText) -> str:
    """The text, checked against its record; InvalidInputError (one line) if missing/changed."""
    reason = problem(entry)
    if reason is not None:
        raise InvalidInputError(reason)
    raw = entry.path.read_bytes()
    if entry.path.suffix == ".gz":
        raw = gzip.decompress(raw)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidInputError(f"corpus text {entry.name} is not UTF-8: {entry.path}") from exc


def get(name: str) -> CorpusText:
    if name not in BY_NAME:
        raise InvalidInputError(f"unknown corpus text {name!r}: one of {', '.join(BY_NAME)}")
    return BY_NAME[name]


def missing(names: tuple[str, ...] | None = None) -> list[str]:
    """One line per text that cannot be used (all texts, or those named)."""
    entries = TEXTS if names is None else tuple(get(n) for n in names)
    return [reason for reason in map(problem, entries) if reason is not None]


def check_all(names: tuple[str, ...] | None = None) -> None:
    """Raise one line for the first missing or changed text (before any long run starts)."""
    problems = missing(names)
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise InvalidInputError(problems[0] + more)
