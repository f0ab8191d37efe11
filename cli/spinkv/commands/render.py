"""rich output helpers. The model's text goes to stdout; everything else goes to stderr."""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from spinkv.generation import GenerationResult
from spinkv.timing import GenerationTimings

PIPED_WIDTH = 160
"""Table width when output is not a terminal (rich would otherwise assume 80 columns)."""


def make_console(*, stderr: bool = False) -> Console:
    console = Console(stderr=stderr, soft_wrap=True, highlight=False)
    if not console.is_terminal:
        console.width = PIPED_WIDTH
    return console


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
    table.add_column("kind")
    table.add_column("ms", justify="right")
    table.add_column("share", justify="right")
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
    table.add_column("key", style="bold", no_wrap=True)
    table.add_column("value")
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
        table.add_column(index, justify="right")
    for column in columns:
        table.add_column(column.replace("_", " "), justify="right")
    for i, record in enumerate(records):
        cells = [_cell(column, record.get(column)) for column in columns]
        table.add_row(*([Text(str(i))] if index else []), *cells)
    return table


def cache_stats_tables(stats: Mapping[str, Any], *, per_layer: bool = False) -> list[Table]:
    """The runtime's cache statistics: the scalar figures, the all-layer total and, if
    per_layer, one row per layer. Keys ending in _bytes are shown as sizes."""
    scalars = {k: v for k, v in stats.items() if not isinstance(v, (Mapping, list))}
    tables = [key_value_table(scalars, title="KV cache")]
    total = stats.get("total")
    if isinstance(total, Mapping):
        tables.append(key_value_table(total, title="all layers"))
    layers = stats.get("layers")
    if per_layer and isinstance(layers, list) and layers:
        tables.append(records_table(layers, title="per layer", index="layer"))
    return tables


def _cell(key: Any, value: Any) -> Text:
    if value is None:
        return Text("-")
    if str(key).endswith("_bytes") and isinstance(value, (int, float)):
        return Text(format_bytes(value))
    if isinstance(value, float):
        return Text(f"{value:.4g}")
    return Text(str(value))
