"""rich output helpers. The model's text goes to stdout; everything else goes to stderr."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable

from rich.cells import cell_len
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table
from rich.text import Text

from spinkv.generation import GenerationResult
from spinkv.timing import GenerationTimings
from spinkv.util.progress import Steps

PIPED_WIDTH = 160
"""Table width when output is not a terminal (rich would otherwise assume 80 columns)."""


def make_console(*, stderr: bool = False) -> Console:
    console = Console(stderr=stderr, soft_wrap=True, highlight=False)
    if not console.is_terminal and not _columns_from_environment():
        console.width = PIPED_WIDTH
    return console


def _columns_from_environment() -> int | None:
    """$COLUMNS when it is a positive number (rich already sizes the console from it)."""
    value = os.environ.get("COLUMNS", "").strip()
    return int(value) if value.isdigit() and int(value) > 0 else None


stderr = make_console(stderr=True)
stdout = make_console()


def print_error(message: str) -> None:
    """One red line on stderr, whatever the message contains."""
    one_line = " ".join(message.split())
    stderr.print(Text(f"error: {one_line}", style="bold red"), soft_wrap=True)


def print_note(message: str) -> None:
    stderr.print(Text(message, style="dim"), soft_wrap=True)


def write_text(piece: str) -> None:
    """Model output, unstyled and unwrapped, straight to stdout."""
    sys.stdout.write(piece)
    sys.stdout.flush()


class WordWrapper:
    """Streams text to a terminal wrapped at word boundaries (a terminal itself breaks lines
    mid-word). A word is held back until the whitespace after it, so it is placed whole."""

    def __init__(self, width: int, write: Callable[[str], None] = write_text) -> None:
        self.width = max(width, 8)
        self.write = write
        self.column = 0
        self.word = ""

    def __call__(self, piece: str) -> None:
        out: list[str] = []
        for char in piece:
            if char == "\n":
                out += [self._place_word(), "\n"]
                self.column = 0
            elif char in " \t":
                out.append(self._place_word())
                if self.column < self.width:
                    out.append(char)
                    self.column += 1
            else:
                self.word += char
        out.append(self._place_word() if cell_len(self.word) >= self.width else "")
        text = "".join(out)
        if text:
            self.write(text)

    def flush(self) -> None:
        text = self._place_word()
        if text:
            self.write(text)

    def _place_word(self) -> str:
        word, self.word = self.word, ""
        if not word:
            return ""
        size = cell_len(word)
        prefix = ""
        if self.column and self.column + size > self.width:
            prefix, self.column = "\n", 0
        self.column = (
            (self.column + size) % self.width if size >= self.width else self.column + size
        )
        return prefix + word


def format_ms(ms: float | None) -> str:
    if ms is None:
        return "-"
    if ms >= 10_000:
        return f"{ms / 1000:.1f} s"
    if ms >= 1000:
        return f"{ms / 1000:.2f} s"
    if ms >= 10:
        return f"{ms:.0f} ms"
    return f"{ms:.1f} ms"


def format_rate(rate: float | None) -> str:
    if rate is None:
        return "-"
    return f"{rate:.0f} tok/s" if rate >= 100 else f"{rate:.1f} tok/s"


def format_bytes(n: float | None) -> str:
    if n is None:
        return "-"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(value) < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} GiB"


def format_count(n: float | None) -> str:
    if n is None:
        return "-"
    for scale, suffix in ((1e9, "B"), (1e6, "M"), (1e3, "K")):
        if abs(n) >= scale:
            return f"{n / scale:.1f}{suffix}"
    return f"{n:g}"


def timing_line(result: GenerationResult, *, show_load: bool = True) -> str:
    """load · tokenize · prefill · first token · decode · sampling · ISA · threads."""
    t = result.timings
    prefill = f"prefill {t.prefill_tokens} tok {format_ms(t.prefill_ms)}"
    if t.prefill_tok_per_s is not None:
        prefill += f" ({format_rate(t.prefill_tok_per_s)})"
    if result.cached_tokens:
        prefill += f" +{result.cached_tokens} cached"
    decode = f"decode {t.decode_tokens} tok {format_ms(t.decode_ms)}"
    if t.decode_tok_per_s is not None:
        decode += f" ({format_rate(t.decode_tok_per_s)})"
    parts = [f"load {format_ms(t.load_ms)}"] if show_load else []
    if show_load and t.import_ms:
        parts.insert(0, f"import {format_ms(t.import_ms)}")
    parts += [
        f"tokenize {format_ms(t.tokenize_ms)}",
        prefill,
        f"first token {format_ms(t.first_token_ms)}",
        decode,
        f"sampling {format_ms(t.sampling_ms)}",
        t.isa or "?",
        f"{t.threads} threads",
    ]
    if result.finish_reason != "stop":
        parts.append(f"stopped: {FINISH_NOTES[result.finish_reason]}")
    return " · ".join(parts)


FINISH_NOTES = {
    "stop": "end of reply",
    "length": "max tokens reached",
    "interrupted": "interrupted",
    "context": "context full",
}


def breakdown_table(t: GenerationTimings) -> Table:
    """Where the forward passes spent their time (runtime timers)."""
    table = Table(title="runtime time by kind", title_justify="left", show_edge=False)
    table.add_column("kind", overflow="fold")
    table.add_column("ms", justify="right", overflow="fold")
    table.add_column("share", justify="right", overflow="fold")
    kinds = {"attention": t.attention_ms, "matmul": t.matmul_ms, "other": t.other_ms}
    known = [v for v in kinds.values() if v is not None]
    total = sum(known)
    for name, value in kinds.items():
        share = f"{100 * value / total:.0f}%" if value is not None and total > 0 else "-"
        table.add_row(name, format_ms(value), share)
    return table


def print_timings(result: GenerationResult, *, verbose: bool, show_load: bool = True) -> None:
    print_note(timing_line(result, show_load=show_load))
    if verbose:
        stderr.print(breakdown_table(result.timings))


def key_value_table(rows: Mapping[str, Any], title: str | None = None) -> Table:
    table = Table(title=title, title_justify="left", show_header=False, show_edge=False)
    table.add_column("key", style="bold", no_wrap=True, overflow="fold")
    table.add_column("value", overflow="fold")
    for key, value in rows.items():
        table.add_row(str(key).replace("_", " "), _cell(key, value))
    return table


def records_table(
    records: Sequence[Mapping[str, Any]], title: str | None = None, index: str | None = None
) -> Table:
    """A table whose columns are the union of the records' keys, in first-seen order;
    index names an extra first column numbering the records."""
    columns: list[str] = []
    for record in records:
        columns += [key for key in record if key not in columns]
    table = Table(title=title, title_justify="left", show_edge=False)
    if index:
        table.add_column(index, justify="right", overflow="fold")
    for column in columns:
        table.add_column(column.replace("_", " "), justify="right", overflow="fold")
    for i, record in enumerate(records):
        cells = [_cell(column, record.get(column)) for column in columns]
        table.add_row(*([Text(str(i))] if index else []), *cells)
    return table


def _cell(key: Any, value: Any) -> Text:
    if value is None:
        return Text("-")
    if str(key).endswith("_bytes") and isinstance(value, (int, float)):
        return Text(format_bytes(value))
    if isinstance(value, float):
        return Text(f"{value:.4g}")
    return Text(str(value))


class RichSteps(Steps):
    """Long steps as a rich progress bar (one task per step); the store additions they
    make as a note. transient: the bar disappears when the step ends (imports), else it
    stays as a record (eval, bench)."""

    def __init__(self, console: Console, *, transient: bool = True) -> None:
        self.console = console
        self.transient = transient
        self.bar: Progress | None = None
        self.task: TaskID | None = None

    def start(self, label: str, total: int | None = None) -> None:
        if self.transient:
            self.finish()
        if self.bar is None:
            self.bar = Progress(
                SpinnerColumn(),
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                console=self.console,
                transient=self.transient,
            )
            self.bar.start()
        self.task = self.bar.add_task(label, total=total)

    def advance(self, units: int = 1) -> None:
        if self.bar is not None and self.task is not None:
            self.bar.advance(self.task, units)

    def finish(self) -> None:
        if self.bar is not None:
            self.bar.stop()
        self.bar, self.task = None, None

    def imported(self, name: str, path: Path, size_bytes: int, seconds: float) -> None:
        self.finish()
        print_note(
            f"added {name} to the model store ({format_bytes(size_bytes)}, "
            f"{format_ms(seconds * 1000)}): {path} · `spinkv models rm {name}` removes it"
        )


class LineSteps(RichSteps):
    """The same for a stderr that is not a terminal (logs, CI): a line every 10 %."""

    STEP = 0.1

    def __init__(self, console: Console) -> None:
        super().__init__(console)
        self.label, self.total, self.done, self.next_share, self.started = "", 0, 0, 0.0, 0.0

    def start(self, label: str, total: int | None = None) -> None:
        self.label, self.total, self.done = label, max(total or 0, 0), 0
        self.next_share, self.started = self.STEP, time.perf_counter()

    def advance(self, units: int = 1) -> None:
        self.done += units
        if not self.total:
            return
        share = self.done / self.total
        if share + 1e-9 >= self.next_share:
            elapsed = time.perf_counter() - self.started
            print_note(f"{self.label}: {share:.0%} ({self.done}/{self.total}) {elapsed:.0f} s")
            while self.next_share <= share + 1e-9:
                self.next_share += self.STEP

    def finish(self) -> None:
        pass


def steps_for(console: Console, *, transient: bool) -> RichSteps:
    """A rich bar on a terminal, 10 % lines elsewhere."""
    return RichSteps(console, transient=transient) if console.is_terminal else LineSteps(console)


@contextmanager
def progress_bar(console: Console) -> Iterator[RichSteps]:
    """A kept progress record for a long command (eval, bench), closed on exit."""
    steps = steps_for(console, transient=False)
    try:
        yield steps
    finally:
        steps.finish()
