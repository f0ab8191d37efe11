"""Tables of a suite record (rich): corpus per text and pooled, per-family metrics, and the
preregistered decision per arm."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rich.table import Table

PCT_METRICS = ("top1", "agreement", "exact_match", "answer_agreement", "finish_agreement")


def _scale(metric: str) -> float:
    return 100.0 if metric.split(".")[-1] in PCT_METRICS else 1.0


def _fmt(x: float | None, metric: str) -> str:
    if x is None:
        return "-"
    name = metric.split(".")[-1]
    x *= _scale(metric)
    if name == "kld_mean":
        return f"{x:.4f}"
    if name in ("ppl_delta_pct",):
        return f"{x:+.2f}"
    return f"{x:.1f}"


def _ci(fig: Mapping[str, float], metric: str) -> str:
    return f"{_fmt(fig['value'], metric)} [{_fmt(fig['lo'], metric)}, {_fmt(fig['hi'], metric)}]"


def corpus_text_table(record: Mapping[str, Any]) -> Table:
    c = record["corpus"]
    table = Table(
        title=f"teacher-forced vs fp16 per text: first {c['tokens']} tokens, positions >= "
        f"{c['skip']}; 95% paired bootstrap CI over positions (* = not held out)",
        title_justify="left",
        show_edge=False,
    )
    for name in ("text", "kind", "arm", "KLD mean", "top-1 %", "Δppl %"):
        table.add_column(name, justify="left" if name in ("text", "kind", "arm") else "right")
    for text in c["texts"]:
        for label, figs in text["arms"].items():
            table.add_row(
                text["name"] + ("" if text["held_out"] else " *"),
                text["kind"],
                label,
                _ci(figs["kld_mean"], "kld_mean"),
                _ci(figs["top1"], "top1"),
                _ci(figs["ppl_delta_pct"], "ppl_delta_pct"),
            )
    return table


def pooled_table(record: Mapping[str, Any]) -> Table:
    c = record["corpus"]
    table = Table(
        title=f"pooled over {len(c['held_out'])} held-out texts (95% CI over texts)",
        title_justify="left",
        show_edge=False,
    )
    for name in ("arm", "bits/ch beyond window", "bits/ch all-in", "KLD", "top-1 %", "Δppl %"):
        table.add_column(name, justify="left" if name == "arm" else "right")
    for label, pooled in c["pooled"].items():
        metrics = record["summary"][label]["metrics"]
        beyond, allin = pooled.get("bits_beyond_window"), pooled.get("bits_all_in")
        table.add_row(
            label,
            "-" if beyond is None else f"{beyond:.2f}",
            "-" if allin is None else f"{allin:.2f}",
            *(
                f"{_fmt(pooled[m], m)} [{_fmt(metrics['corpus.' + m]['arm']['lo'], m)}, "
                f"{_fmt(metrics['corpus.' + m]['arm']['hi'], m)}]"
                for m in ("kld_mean", "top1", "ppl_delta_pct")
            ),
        )
    for ref in record.get("references", []):
        pooled = ref["pooled"]
        table.add_row(
            f"{ref['label']} (reference)",
            f"{pooled['bits_beyond_window']:.2f}",
            "-",
            *(_fmt(pooled[m], m) for m in ("kld_mean", "top1", "ppl_delta_pct")),
        )
    return table


def metrics_table(label: str, arm: Mapping[str, Any]) -> Table:
    table = Table(
        title=f"{label} against fp16 (same prompts, decodings, seeds): mean per unit with 95% "
        "bootstrap CI; p = paired sign-flip permutation",
        title_justify="left",
        show_edge=False,
    )
    for name in ("metric", "n", "arm", "fp16", "Δ vs fp16", "p(Δ≠0)", "budget", "p(non-inf)", "ok"):
        table.add_column(name, justify="left" if name in ("metric", "budget") else "right")
    for name, row in arm["metrics"].items():
        budget = row.get("budget")
        bar = row.get("bar")
        budget_text = "-" if budget is None else budget["describe"]
        if bar is not None:
            budget_text += f" (bar {bar:.1f})"
        ok = row.get("within_budget")
        table.add_row(
            name,
            str(row["n"]),
            _ci(row["arm"], name),
            _fmt(row["fp16"], name),
            _ci(row["delta"], name),
            f"{row['p_difference']:.3g}",
            budget_text,
            "-" if "p_noninferior" not in row else f"{row['p_noninferior']:.3g}",
            "" if ok is None else ("yes" if ok else "NO"),
        )
    return table


def verdict_table(record: Mapping[str, Any]) -> Table:
    pre = record["preregistration"]
    table = Table(
        title=f"preregistered decision (v{pre['version']}, alpha {pre['alpha']}, Holm over "
        f"{len(pre['holm_family'])} ship metrics; H0: the arm is outside the metric's budget)",
        title_justify="left",
        show_edge=False,
    )
    for name in ("arm", "ship metric", "p", "p Holm", "H0"):
        table.add_column(name, justify="right" if name.startswith("p") else "left")
    for label, arm in record["summary"].items():
        holm = {row["metric"]: row for row in arm["holm"]}
        for i, metric in enumerate(pre["holm_family"]):
            row = holm.get(metric)
            cells = (
                ["-", "-", "not measured"]
                if row is None
                else [
                    f"{row['p']:.3g}",
                    f"{row['p_holm']:.3g}",
                    "rejected" if row["rejected"] else "NOT rejected",
                ]
            )
            table.add_row(label if i == 0 else "", metric, *cells)
        table.add_row("", "[bold]verdict[/bold]", "", "", f"[bold]{arm['verdict']}[/bold]")
        table.add_section()
    return table


def reasons_table(record: Mapping[str, Any]) -> Table:
    table = Table(title="why", title_justify="left", show_edge=False)
    table.add_column("arm")
    table.add_column("verdict")
    table.add_column("reason", overflow="fold")
    for label, arm in record["summary"].items():
        for i, reason in enumerate(arm["reasons"] or ["every preregistered rule met"]):
            table.add_row(label if i == 0 else "", arm["verdict"] if i == 0 else "", reason)
    return table


def suite_tables(record: Mapping[str, Any]) -> list[Table]:
    tables: list[Table] = []
    if record.get("corpus"):
        tables += [corpus_text_table(record), pooled_table(record)]
    for label, arm in record["summary"].items():
        tables.append(metrics_table(label, arm))
    tables += [verdict_table(record), reasons_table(record)]
    return tables
