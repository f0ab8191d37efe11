"""What `spinkv bench` prints: the machine header and the results as a rich table, Markdown,
CSV, JSON or JSON lines."""

from __future__ import annotations

import csv
import io
import json
import os
import platform
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from rich.console import Console
from rich.table import Table

from spinkv.bench.cases import KV_PHASES
from spinkv.cli.render import format_bytes
from spinkv.util.system import cpu_info

FORMATS = ("table", "md", "csv", "json", "jsonl")
SCHEMA = "spinkv.bench/1"
INTERESTING_FLAGS = (
    "sse4_2",
    "avx",
    "fma",
    "f16c",
    "avx2",
    "avx512f",
    "avx512bw",
    "avx512vl",
    "avx512_bf16",
    "avx512_fp16",
    "asimd",
    "fphp",
    "asimdhp",
)
META_KEYS = ("cpu", "threads", "build", "model")
"""System fields repeated on every CSV / JSON-lines row, as llama-bench does."""


# ---- the machine ----------------------------------------------------------------------------


def system_info(model: Any, *, isas: Sequence[str], command: str) -> dict[str, Any]:
    """The header: CPU and its flags, ISAs, threads, build, model, load average."""
    from spinkv import __version__, _native

    cpu, flags = cpu_info()
    config = model.config
    return {
        "command": command,
        "date": time.strftime("%Y-%m-%d %H:%M:%S %z"),
        "cpu": cpu,
        "cores": os.cpu_count(),
        "cpu_flags": [f for f in INTERESTING_FLAGS if f in flags],
        "cpu_isas": list(_native.cpu_features()),
        "default_isa": _native.isa(),
        "isas": list(isas),
        "threads": _native.threads(),
        "build": _native.runtime_build(),
        "python_package": __version__,
        "model": model.name,
        "model_path": str(model.path),
        "model_dtype": config.get("dtype"),
        "model_params": config.get("n_params"),
        "machine": f"{platform.system()} {platform.machine()}, Python {platform.python_version()}",
        "load_average": [round(x, 2) for x in os.getloadavg()],
    }


def memory_bound(config: Mapping[str, Any]) -> dict[str, Any]:
    """The compute pool's memory read bandwidth (a 256 MiB buffer summed 5 times, median) and
    the decode rate that reading the weights alone allows: a floor no kernel gets under."""
    from spinkv import _native

    probe = _native.read_bandwidth()
    weight_bytes = int(config.get("decode_weight_bytes") or 0)
    gbps = float(probe["gb_per_s"])
    return {
        "read_gb_per_s": round(gbps, 2),
        "read_best_gb_per_s": round(float(probe["best_gb_per_s"]), 2),
        "probe_threads": int(probe["threads"]),
        "decode_weight_bytes": weight_bytes,
        "weight_bound_tok_s": round(gbps * 1e9 / weight_bytes, 1) if weight_bytes else None,
    }


def memory_line(memory: Mapping[str, Any]) -> str:
    line = (
        f"memory: reads {memory['read_gb_per_s']:.1f} GB/s with {memory['probe_threads']} "
        f"threads (best {memory['read_best_gb_per_s']:.1f})"
    )
    if memory.get("weight_bound_tok_s"):
        line += (
            f"; a decode step reads {memory['decode_weight_bytes'] / 1e6:.0f} MB of weights, "
            f"so at most {memory['weight_bound_tok_s']:.1f} tok/s at that rate"
        )
    return line


def header_lines(system: Mapping[str, Any]) -> list[str]:
    params = system.get("model_params")
    size = f", {params / 1e6:.1f} M params" if params else ""
    lines = [
        f"CPU: {system['cpu']} ({system['cores']} cores); flags: "
        + (" ".join(system["cpu_flags"]) or "-"),
        f"ISAs: {', '.join(system['cpu_isas'])} (default {system['default_isa']}); "
        f"benchmarked: {', '.join(system['isas'])}; threads: {system['threads']}",
        f"build: {system['build']}",
        f"model: {system['model']} ({system.get('model_dtype')}{size})",
        "load average at start: " + " ".join(map(str, system["load_average"])),
    ]
    if system.get("load_average_end"):
        lines[-1] += "; at end: " + " ".join(map(str, system["load_average_end"]))
    if system.get("memory"):
        lines.append(memory_line(system["memory"]))
    if system.get("llama_cpp"):
        lines.append(f"llama.cpp: {system['llama_cpp']}")
    cores = system.get("cores") or 1
    start = system["load_average"][0]
    end = (system.get("load_average_end") or [0.0])[0]
    # the run itself adds about `threads` to the load at the end
    if start > cores - 0.5 or end > cores + 0.5:
        busiest = max(start, end)
        warning = f"warning: the machine was busy (load {busiest:.1f} on {system['cores']} cores)"
        warning += ": figures are noisy"
        if system.get("llama_cpp"):
            warning += (
                ", and llama.cpp's spinning thread barriers slow down badly when its threads "
                "are preempted"
            )
        lines.append(warning)
    return lines


# ---- cells ----------------------------------------------------------------------------------


def fmt_num(value: float | None, digits: int | None = None) -> str:
    """A figure with digits decimals; by default fewer the larger it is."""
    if value is None:
        return "-"
    if digits is None:
        digits = 0 if abs(value) >= 100 else 1 if abs(value) >= 1 else 2
    return f"{value:.{digits}f}"


def _pm(row: Mapping[str, Any], key: str) -> str:
    mean, std = row.get(key), row.get(f"{key}_std")
    if mean is None:
        return "-"
    if not std:
        return fmt_num(mean)
    digits = 0 if abs(mean) >= 100 else 1 if abs(mean) >= 1 else 2
    return f"{mean:.{digits}f} ± {std:.{digits}f}"


def _phase(row: Mapping[str, Any], prefix: str) -> str:
    parts = [row.get(f"{prefix}_{k}_ms") for k in ("attention", "matmul", "other")]
    if all(p is None for p in parts):
        return "-"
    return "/".join(fmt_num(p, 2) for p in parts)


def _kv_phases(row: Mapping[str, Any]) -> str:
    parts = [row.get(f"kv_{phase}_ms") for phase in KV_PHASES]
    if all(p is None for p in parts):
        return "-"
    return "/".join(fmt_num(None if p is None else p * 1000.0, 0) for p in parts)


def fmt_size(value: Any) -> str:
    return "-" if value is None else format_bytes(value)


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}×"


Column = tuple[str, Callable[[Mapping[str, Any]], str]]


def bench_columns(rows: Sequence[Mapping[str, Any]]) -> list[Column]:
    """The result columns; p and n get their own columns only when they vary."""
    prompts = {r["n_prompt"] for r in rows}
    gens = {r["n_gen"] for r in rows}
    pp = f"pp{next(iter(prompts))}" if len(prompts) == 1 else "pp"
    tg = f"tg{next(iter(gens))}" if len(gens) == 1 else "tg"
    columns: list[Column] = [
        ("engine", lambda r: str(r["engine"])),
        ("isa", lambda r: str(r["isa"])),
        ("kv", lambda r: str(r["kv"])),
        ("depth", lambda r: str(r["depth"])),
    ]
    if len(prompts) > 1:
        columns.append(("p", lambda r: str(r["n_prompt"])))
    if len(gens) > 1:
        columns.append(("n", lambda r: str(r["n_gen"])))
    columns += [
        ("fill t/s", lambda r: fmt_num(r.get("fill_tok_s"))),
        (f"{pp} t/s", lambda r: _pm(r, "pp_tok_s")),
        ("1st decode ms", lambda r: fmt_num(r.get("first_decode_ms"))),
        (f"{tg} t/s", lambda r: _pm(r, "tg_tok_s")),
        ("tg attn/mm/other ms", lambda r: _phase(r, "tg")),
        ("codec %", lambda r: fmt_num(r.get("codec_pct"))),
        ("KV phases µs/tok", _kv_phases),
        ("V skipped %", lambda r: fmt_num(r.get("kv_value_skipped_pct"))),
        ("peak RSS", lambda r: fmt_size(r.get("peak_rss_bytes"))),
        ("KV payload", lambda r: fmt_size(r.get("kv_payload_bytes"))),
        ("scratch", lambda r: fmt_size(r.get("scratch_bytes"))),
    ]
    return columns


RATIO_TITLE = "ours / llama.cpp at its best f16-KV configuration per depth (ratios of medians)"
RATIO_COLUMNS: list[Column] = [
    ("isa", lambda r: str(r["isa"])),
    ("kv", lambda r: str(r["kv"])),
    ("depth", lambda r: str(r["depth"])),
    ("fill", lambda r: _ratio(r.get("fill_tok_s_ratio"))),
    ("pp", lambda r: _ratio(r.get("pp_tok_s_ratio"))),
    ("tg", lambda r: _ratio(r.get("tg_tok_s_ratio"))),
    ("decode", lambda r: _ratio(r.get("decode_tok_s_ratio"))),
    ("llama.cpp decode anchor", lambda r: str(r.get("decode_tok_s_reference") or "")),
    (
        "same greedy tokens",
        lambda r: f"{r.get('same_greedy_tokens', 0)}/{r.get('greedy_tokens', 0)}",
    ),
]

CASE_COLUMNS: list[Column] = [
    ("isa", lambda r: str(r["isa"])),
    ("runtime", lambda r: str(r["runtime"])),
    ("kernel case", lambda r: str(r["case"])),
    ("GB/s", lambda r: fmt_num(r.get("gb_s"), 2)),
    ("ns/token", lambda r: fmt_num(r.get("ns_per_token"), 1)),
    ("ms", lambda r: fmt_num(r.get("ms"), 2)),
]
CASE_TITLE = "kernel cases per ISA (spinkv-kernels bench.rs)"

BENCH_NOTES = " ".join(
    (
        "t/s: tokens per second, mean ± sample std over the repetitions (medians, the all-n",
        "decode rate and prefill phases are in csv/json). fill = prefill of `depth` tokens",
        "from empty; pp = prefill of p tokens at that depth; 1st decode = the first decode",
        "step; tg = the decode steps after the first (n-1 of them); tg attn/mm/other = the",
        "runtime's timers per decode token (attention includes the KV append); codec % =",
        "estimated append-time encoding as a share of decode time (extra attention time of",
        "the steps that sealed a page); peak RSS = the process's high-water mark during the",
        "case; KV payload = packed K+V (+ norm) bytes at depth + n; KV phases = µs per decode",
        "token in query transform / key scan / softmax / value scan / value finish (inverse",
        "transform) / append encoding / page allocation, from one extra profiled pass",
        "(attention phases are thread time summed over the pool).",
    )
)


# ---- renderers ------------------------------------------------------------------------------


def rich_tables(record: Mapping[str, Any], columns: Sequence[Column] | None) -> list[Table]:
    columns = columns or bench_columns(record["rows"])
    tables = [_rich_table(record["rows"], columns, None)]
    if record.get("ratios"):
        tables.append(_rich_table(record["ratios"], RATIO_COLUMNS, RATIO_TITLE))
    if record.get("kernel_cases"):
        tables.append(_rich_table(record["kernel_cases"], CASE_COLUMNS, CASE_TITLE))
    return tables


def _rich_table(
    rows: Sequence[Mapping[str, Any]], columns: Sequence[Column], title: str | None
) -> Table:
    table = Table(title=title, title_justify="left", show_edge=False)
    for i, (name, _) in enumerate(columns):
        table.add_column(name, justify="left" if i < 3 else "right", overflow="fold")
    for row in rows:
        table.add_row(*(cell(row) for _, cell in columns))
    return table


def markdown(record: Mapping[str, Any], columns: Sequence[Column] | None) -> str:
    columns = columns or bench_columns(record["rows"])
    system = record["system"]
    out = [f"`{system['command']}`", ""]
    out += [f"- {line}" for line in header_lines(system)]
    out += ["", *_md_table(record["rows"], columns)]
    if record.get("ratios"):
        out += [
            "",
            f"{RATIO_TITLE}:",
            "",
            *_md_table(record["ratios"], RATIO_COLUMNS),
        ]
    if record.get("kernel_cases"):
        out += ["", f"{CASE_TITLE}:", "", *_md_table(record["kernel_cases"], CASE_COLUMNS)]
    out += ["", *(f"_{note}_" for note in record.get("notes", ()))]
    return "\n".join(out) + "\n"


def _md_table(rows: Sequence[Mapping[str, Any]], columns: Sequence[Column]) -> list[str]:
    lines = ["| " + " | ".join(name for name, _ in columns) + " |"]
    lines.append("|" + "|".join("---" if i < 3 else "---:" for i in range(len(columns))) + "|")
    lines += ["| " + " | ".join(cell(row) for _, cell in columns) + " |" for row in rows]
    return lines


def _meta(system: Mapping[str, Any]) -> dict[str, Any]:
    return {key: system.get(key) for key in META_KEYS}


def csv_text(record: Mapping[str, Any]) -> str:
    meta = _meta(record["system"])
    rows = [{**row, **meta} for row in record["rows"]]
    fields: list[str] = []
    for row in rows:
        fields += [key for key in row if key not in fields and key != "greedy_tokens"]
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=fields, extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return buffer.getvalue()


def jsonl_line(kind: str, row: Mapping[str, Any], system: Mapping[str, Any]) -> str:
    """One JSON-lines record: kind ("result" or "ratio"), the row, the system fields."""
    return json.dumps({"record": kind, **row, **_meta(system)}) + "\n"


def jsonl_text(record: Mapping[str, Any], *, results: bool = True) -> str:
    system = record["system"]
    lines = [jsonl_line("result", row, system) for row in record["rows"]] if results else []
    lines += [jsonl_line("ratio", row, system) for row in record.get("ratios", ())]
    return "".join(lines)


def json_text(record: Mapping[str, Any]) -> str:
    return json.dumps({"schema": SCHEMA, **record}, indent=2) + "\n"


def emit(
    record: Mapping[str, Any],
    fmt: str,
    *,
    out: Console,
    columns: Sequence[Column] | None = None,
    streamed: bool = False,
) -> None:
    """Print record to out in fmt (the rich table with the machine header above it);
    streamed: the jsonl result lines were printed as the rows came (see jsonl_line)."""
    if fmt == "table":
        for line in header_lines(record["system"]):
            out.print(line, style="dim", soft_wrap=True, markup=False)
        for table in rich_tables(record, columns):
            out.print(table)
        for note in record.get("notes", ()):
            out.print(note, style="dim", soft_wrap=True, markup=False)
        return
    text = {
        "md": lambda: markdown(record, columns),
        "csv": lambda: csv_text(record),
        "json": lambda: json_text(record),
        "jsonl": lambda: jsonl_text(record, results=not streamed),
    }[fmt]()
    out.file.write(text)
    out.file.flush()
