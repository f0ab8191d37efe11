"""Facts, passages and code taken from the corpus texts, for the suite's prompts: every
prompt is built from real text (corpus.TEXTS), never from made-up content."""

from __future__ import annotations

import ast
import re
import textwrap
from dataclasses import dataclass
from functools import cache

from spinkv.eval import corpus


@dataclass(frozen=True)
class Service:
    name: str
    port: int
    protocol: str
    line: str


@dataclass(frozen=True)
class Country:
    code: str
    name: str
    line: str


@cache
def text(name: str) -> str:
    return corpus.load_text(corpus.get(name))


@cache
def service_lines() -> tuple[str, ...]:
    """The entries of /etc/services (comment-only and blank lines dropped)."""
    return tuple(
        line.rstrip()
        for line in text("services").splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    )


@cache
def services() -> tuple[Service, ...]:
    """Each service name once (its first entry), with its port and protocol."""
    seen: set[str] = set()
    out: list[Service] = []
    for line in service_lines():
        fields = line.split("#", 1)[0].split()
        if len(fields) < 2 or "/" not in fields[1]:
            continue
        port, proto = fields[1].split("/", 1)
        name = fields[0]
        if name in seen or not port.isdigit() or not re.fullmatch(r"[a-z][a-z0-9-]*", name):
            continue
        seen.add(name)
        out.append(Service(name, int(port), proto, line))
    return tuple(out)


@cache
def countries() -> tuple[Country, ...]:
    """ISO 3166 codes with plain names (letters and spaces only)."""
    out: list[Country] = []
    for line in text("iso3166-tab").splitlines():
        if not line or line.startswith("#"):
            continue
        code, _, name = line.partition("\t")
        if re.fullmatch(r"[A-Za-z ]+", name) and len(code) == 2:
            out.append(Country(code, name.strip(), line))
    return tuple(out)


PROSE_TEXTS = ("bash-intro", "python-history", "gcc-readme-bugs", "apache-2.0", "mpl-2.0")


@cache
def paragraphs(min_chars: int = 250, max_chars: int = 1100) -> tuple[tuple[str, str], ...]:
    """(text name, paragraph) of running prose: blank-line separated, mostly words,
    min_chars..max_chars long, whitespace normalised, in corpus order."""
    out: list[tuple[str, str]] = []
    for name in PROSE_TEXTS:
        for block in re.split(r"\n\s*\n", text(name)):
            para = " ".join(block.split())
            letters = sum(ch.isalpha() or ch == " " for ch in para)
            if min_chars <= len(para) <= max_chars and letters >= 0.85 * len(para):
                out.append((name, para))
    return tuple(out)


@cache
def sentences() -> tuple[tuple[str, str], ...]:
    """(text name, sentence) of 60..220 characters from the prose paragraphs."""
    out: list[tuple[str, str]] = []
    for name, para in paragraphs():
        for sentence in re.split(r"(?<=[.!?])\s+", para):
            if 60 <= len(sentence) <= 220 and sentence[0].isupper():
                out.append((name, sentence))
    return tuple(out)


CODE_TEXTS = ("textwrap-py", "json-decoder-py")


@cache
def python_functions(max_chars: int = 1400) -> tuple[tuple[str, str, str], ...]:
    """(text name, function name, source) of every function and method of the Python
    corpus files, at most max_chars long, in file order."""
    out: list[tuple[str, str, str]] = []
    for name in CODE_TEXTS:
        source = text(name)
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                segment = ast.get_source_segment(source, node)
                if segment and 80 <= len(segment) <= max_chars:
                    code = textwrap.dedent(" " * node.col_offset + segment)
                    out.append((name, node.name, code))
    out.sort(key=lambda item: (CODE_TEXTS.index(item[0]), text(item[0]).find(f"def {item[1]}(")))
    return tuple(out)
