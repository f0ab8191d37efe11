"""`spinkv cache stats`: where a session's KV cache bytes go, per layer and in total.

Every figure comes from the runtime's `Session.cache_stats()` (pages actually allocated);
`render_cache_stats(stats, console)` is shared with the chat REPL's `/stats`."""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from spinkv.cli import options as opt
from spinkv.cli.render import format_bytes, print_note, stdout
from spinkv.errors import InvalidInputError
from spinkv.generation import PREFILL_BLOCK_TOKENS
from spinkv.kv.options import DEFAULT_KV_PRESET, kv_options
from spinkv.util.system import peak_rss_bytes

DEFAULT_TEXT = Path("/usr/share/common-licenses/GPL-3")
DEFAULT_TOKENS = 4096

COLUMNS = (
    ("tokens", "tokens"),
    ("compressed_tokens", "coded"),
    ("fp16_tokens", "fp16"),
    ("recycled_tokens", "recycled"),
    ("pages_used", "pages"),
    ("k_payload_bytes", "K payload"),
    ("v_payload_bytes", "V payload"),
    ("norm_bytes", "norms"),
    ("header_bytes", "headers"),
    ("padding_bytes", "padding"),
    ("window_bytes", "window"),
    ("allocated_bytes", "allocated"),
    ("bits_per_channel", "bits/ch"),
    ("compression_vs_fp16", "× vs fp16"),
)

app = opt.command_group("Inspect the KV cache.")


def layer_pages(stats: Mapping[str, Any], layer: Mapping[str, Any]) -> tuple[int, int]:
    """(fp16 pages, compressed pages) of one layer (or of the total), from its byte counts."""
    fp16_page = int(stats["fp16_page_bytes"])
    fp16_pages = int(layer["window_bytes"]) // fp16_page if fp16_page else 0
    return fp16_pages, int(layer["pages_used"]) - fp16_pages


def accounting_problems(stats: Mapping[str, Any]) -> list[str]:
    """Ways the figures disagree with each other or with the allocator's page count (the
    runtime's own invariants, `CacheStats::accounting_problems`); empty when they agree."""
    from spinkv import _native

    return list(_native.check_cache_stats(dict(stats)))


def _cell(key: str, value: Any) -> str:
    if value is None:
        return "-"
    if key.endswith("_bytes"):
        return format_bytes(value)
    if key == "bits_per_channel":
        return f"{value:.2f}"
    if key == "compression_vs_fp16":
        return f"{value:.2f}×"
    return str(value)


def layer_kinds(stats: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Layers grouped by attention kind (full, or each sliding window size): how many, the
    tokens they hold and recycled, bytes and the ratios, summed over the group."""
    groups: dict[int, dict[str, Any]] = {}
    for layer in stats["layers"]:
        window = int(layer.get("window", 0))
        group = groups.setdefault(
            window,
            {"kind": f"local (window {window})" if window else "global (full attention)"}
            | {"layers": 0, "held_tokens": 0, "compressed_tokens": 0, "fp16_tokens": 0}
            | {"recycled_tokens": 0, "allocated_bytes": 0, "fp16_equivalent_bytes": 0},
        )
        group["layers"] += 1
        held = int(layer["compressed_tokens"]) + int(layer["fp16_tokens"])
        group["held_tokens"] += held
        for key in ("compressed_tokens", "fp16_tokens", "recycled_tokens", "allocated_bytes"):
            group[key] += int(layer.get(key, 0))
        ratio = float(layer["compression_vs_fp16"])
        group["fp16_equivalent_bytes"] += int(round(ratio * int(layer["allocated_bytes"])))
    for group in groups.values():
        fp16 = group["fp16_equivalent_bytes"]
        group["compression_vs_fp16"] = fp16 / group["allocated_bytes"] if fp16 else 0.0
    return [groups[w] for w in sorted(groups)]


def kinds_table(stats: Mapping[str, Any]) -> Table:
    """One row per layer kind: full attention, and each sliding window (recycled pages)."""
    table = Table(title="KV cache by layer kind", title_justify="left", show_edge=False)
    headers = ("kind", "layers", "held", "coded", "fp16", "recycled", "allocated", "vs fp16")
    for i, header in enumerate(headers):
        table.add_column(header, justify="left" if i == 0 else "right", overflow="fold")
    for g in layer_kinds(stats):
        table.add_row(
            g["kind"],
            str(g["layers"]),
            str(g["held_tokens"]),
            str(g["compressed_tokens"]),
            str(g["fp16_tokens"]),
            str(g["recycled_tokens"]),
            format_bytes(g["allocated_bytes"]),
            _cell("compression_vs_fp16", g["compression_vs_fp16"]),
        )
    return table


def layers_table(stats: Mapping[str, Any]) -> Table:
    """One row per layer and a total row."""
    table = Table(title="KV cache by layer", title_justify="left", show_edge=False)
    table.add_column("layer", justify="right", overflow="fold")
    for _, header in COLUMNS:
        table.add_column(header, justify="right", overflow="fold")
    for i, layer in enumerate(stats["layers"]):
        table.add_row(str(i), *(_cell(k, layer.get(k)) for k, _ in COLUMNS))
    total = stats["total"]
    table.add_row("total", *(_cell(k, total.get(k)) for k, _ in COLUMNS), style="bold")
    return table


def summary_table(stats: Mapping[str, Any], peak_rss: int | None) -> Table:
    total = stats["total"]
    fp16_pages, coded_pages = layer_pages(stats, total)
    rows = {
        "codec": str(stats["codec"]),
        "tokens (per layer)": str(stats["tokens"]),
        "pages used": f"{total['pages_used']} ({fp16_pages} fp16, {coded_pages} compressed)",
        "pages free": str(stats["pages_free"]),
        "page size": f"fp16 {format_bytes(stats['fp16_page_bytes'])}, compressed "
        + (format_bytes(stats["sealed_page_bytes"]) if stats["sealed_page_bytes"] else "-"),
        "allocated": format_bytes(total["allocated_bytes"]),
        "pool (incl. free pages)": format_bytes(stats["pool_bytes"]),
        "window (fp16 pages)": format_bytes(total["window_bytes"]),
        "scratch (peak)": format_bytes(stats["scratch_bytes"]),
        "same tokens in fp16": format_bytes(stats["fp16_equivalent_bytes"]),
        "all-in bits per channel": _cell("bits_per_channel", total["bits_per_channel"]),
        "compression vs fp16": _cell("compression_vs_fp16", total["compression_vs_fp16"]),
    }
    if peak_rss is not None:
        rows["process peak RSS"] = format_bytes(peak_rss)
    table = Table(title="KV cache", title_justify="left", show_header=False, show_edge=False)
    table.add_column("key", style="bold", no_wrap=True, overflow="fold")
    table.add_column("value", overflow="fold")
    for key, value in rows.items():
        table.add_row(key, value)
    return table


def render_cache_stats(
    stats: Mapping[str, Any],
    console: Console,
    *,
    per_layer: bool = True,
    peak_rss: int | None = -1,
) -> None:
    """Print `Session.cache_stats()`: the summary, then (per_layer) the by-layer table.
    peak_rss: bytes to show, -1 to measure this process now, None to leave it out."""
    rss = peak_rss_bytes() if peak_rss == -1 else peak_rss
    console.print(summary_table(stats, rss))
    if any(int(layer.get("window", 0)) for layer in stats["layers"]):
        console.print()
        console.print(kinds_table(stats))
    if per_layer:
        console.print()
        console.print(layers_table(stats))
    problems = accounting_problems(stats)
    if problems:
        console.print(f"[bold red]accounting mismatch:[/] {'; '.join(problems)}")


def text_token_ids(loaded: Any, path: Path, n_tokens: int) -> list[int]:
    """BOS then the text's tokens; the text repeats if it is shorter than n_tokens."""
    if not path.is_file():
        raise InvalidInputError(f"no such text file: {path}")
    # Only what n_tokens tokens can take is read: a file of gigabytes costs no more than that.
    with path.open(encoding="utf-8", errors="replace") as file:
        body = loaded.tokenize(file.read(loaded.tokenizer.max_chars_for(n_tokens)))
    if not body:
        raise InvalidInputError(f"{path} has no text")
    bos = loaded.config.get("bos_token_id")
    ids = [int(bos)] if bos is not None else []
    while len(ids) < n_tokens:
        ids += body[: n_tokens - len(ids)]
    return ids[:n_tokens]


def stats_record(
    loaded: Any, kv: dict[str, Any] | None, stats: Mapping[str, Any]
) -> dict[str, Any]:
    return {
        "model": loaded.name,
        "kv": kv or {"preset": DEFAULT_KV_PRESET},
        "stats": dict(stats),
        "peak_rss_bytes": peak_rss_bytes(),
        "accounting_problems": accounting_problems(stats),
        "layer_kinds": layer_kinds(stats),
    }


@app.command("stats")
def stats_command(
    model: opt.ModelOption = None,
    threads: opt.ThreadsOption = None,
    kv: opt.KvPresetOption = None,
    k_bits: opt.KBitsOption = None,
    v_bits: opt.VBitsOption = None,
    kv_window: opt.KvWindowOption = None,
    kv_page: opt.KvPageOption = None,
    sink_tokens: opt.SinkTokensOption = None,
    tokens: Annotated[
        int, typer.Option("--tokens", help="Tokens of text to prefill (BOS first).")
    ] = DEFAULT_TOKENS,
    text: Annotated[
        Path, typer.Option("--text", help="UTF-8 text to prefill (repeated if short).")
    ] = DEFAULT_TEXT,
    per_layer: Annotated[
        bool, typer.Option("--layers/--no-layers", help="Show the by-layer table.")
    ] = True,
    json_output: Annotated[
        bool, typer.Option("--json", help="Print the figures as JSON.", rich_help_panel=opt.OUTPUT)
    ] = False,
) -> None:
    """Prefill real text into a session and show where its KV cache bytes go."""
    if tokens < 1:
        raise InvalidInputError(f"--tokens {tokens} must be at least 1")
    kv_dict = kv_options(
        opt.choice_value(kv),
        k_bits=k_bits,
        v_bits=v_bits,
        window=kv_window,
        page_tokens=kv_page,
        sink_tokens=sink_tokens,
    )

    import spinkv.api as api

    loaded = api.load(model, threads=threads)
    if tokens > loaded.context_limit(kv_dict):  # before a list of that many ids is built
        raise InvalidInputError(
            f"--tokens {tokens} exceeds the context of {loaded.context_limit(kv_dict)}"
        )
    ids = text_token_ids(loaded, text, tokens)
    session = loaded.session(kv_dict)
    for lo in range(0, len(ids), PREFILL_BLOCK_TOKENS):
        session.prefill(ids[lo : lo + PREFILL_BLOCK_TOKENS])
    stats = session.cache_stats()
    if json_output:
        record = stats_record(loaded, kv_dict, stats)
        sys.stdout.write(json.dumps(record) + "\n")
        return
    print_note(f"{loaded.name}: {len(ids)} tokens of {text} prefilled")
    render_cache_stats(stats, stdout, per_layer=per_layer)
