"""`spinkv eval --suite ... --plot DIR`: PNGs of a suite record (matplotlib).

- pareto.png: pooled held-out KLD and top-1 against the all-in bits per channel of the
  compressed pages, every arm and fp16 (16 bits, KLD 0), and llama.cpp's KV caches when their
  reference rows were merged in (squares when on the front); the Pareto front joined.
- families.png: per family, each arm's delta against fp16 with its 95% CI and the budget.
- depth.png: pooled held-out KLD against position.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from spinkv.errors import InvalidInputError
from spinkv.eval.families import EXACT_FAMILIES, FAMILIES
from spinkv.eval.plot import require_matplotlib

KLD_FLOOR = 1e-4


def pareto_points(record: Mapping[str, Any]) -> list[tuple[str, float, float, float]]:
    """(label, bits, KLD, top-1) per arm with a bit rate, plus fp16 at (16, 0, 1)."""
    points = [("fp16", 16.0, 0.0, 1.0)]
    for label, pooled in record["corpus"]["pooled"].items():
        bits = pooled.get("bits_beyond_window")
        if bits is None and label.startswith("fp16"):
            bits = 16.0
        if bits is not None:
            points.append((label, float(bits), pooled["kld_mean"], pooled["top1"]))
    for ref in record.get("references", []):  # llama.cpp's KV caches on the same corpus
        pooled = ref["pooled"]
        if pooled.get("bits_beyond_window") is not None:
            bits = float(pooled["bits_beyond_window"])
            points.append((ref["label"], bits, pooled["kld_mean"], pooled["top1"]))
    return points


def pareto_front(points: list[tuple[str, float, float, float]]) -> list[str]:
    """Labels not dominated (another point with no more bits and no more KLD, one strictly)."""
    front = []
    for label, bits, kld, _ in points:
        dominated = any(
            b <= bits and k <= kld and (b < bits or k < kld)
            for lab, b, k, _ in points
            if lab != label
        )
        if not dominated:
            front.append(label)
    return front


def _pyplot() -> Any:
    require_matplotlib()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_pareto(record: Mapping[str, Any], path: Path) -> Path:
    plt = _pyplot()
    points = pareto_points(record)
    front = set(pareto_front(points))
    fig, (ax_kld, ax_top1) = plt.subplots(1, 2, figsize=(12, 5))
    references = {ref["label"] for ref in record.get("references", [])}
    for label, bits, kld, top1 in points:
        style = ("s" if label in references else "o") if label in front else "x"
        ax_kld.plot(bits, max(kld, KLD_FLOOR), style, label=label)
        ax_kld.annotate(label, (bits, max(kld, KLD_FLOOR)), fontsize=7, xytext=(4, 4),
                        textcoords="offset points")  # fmt: skip
        ax_top1.plot(bits, 100 * top1, style)
        ax_top1.annotate(label, (bits, 100 * top1), fontsize=7, xytext=(4, 4),
                         textcoords="offset points")  # fmt: skip
    ordered = sorted((p for p in points if p[0] in front), key=lambda p: p[1])
    ax_kld.plot([p[1] for p in ordered], [max(p[2], KLD_FLOOR) for p in ordered], "k--", lw=0.8)
    ax_kld.set_yscale("log")
    ax_kld.set_xlabel("all-in bits per channel beyond the fp16 window")
    ax_kld.set_ylabel(f"pooled held-out KLD vs fp16 (floor {KLD_FLOOR:g})")
    ax_top1.set_xlabel("all-in bits per channel beyond the fp16 window")
    ax_top1.set_ylabel("pooled held-out top-1 agreement %")
    for ax in (ax_kld, ax_top1):
        ax.grid(True, alpha=0.3)
    model = record.get("model", {}).get("name", "")
    ax_kld.set_title(f"Pareto front (o = on the front): {model}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def family_metric(family: str) -> str:
    return f"{family}.exact_match" if family in EXACT_FAMILIES else f"{family}.chrf"


def plot_families(record: Mapping[str, Any], path: Path) -> Path:
    plt = _pyplot()
    summary = record["summary"]
    present = [
        f for f in FAMILIES if any(family_metric(f) in a["metrics"] for a in summary.values())
    ]
    if not present:
        raise InvalidInputError("--plot families needs the tasks part")
    cols = 4
    rows = (len(present) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(4 * cols, 2.2 + 1.6 * rows), squeeze=False)
    labels = list(summary)
    for ax, family in zip(axes.flat, present):
        metric = family_metric(family)
        for y, label in enumerate(labels):
            row = summary[label]["metrics"].get(metric)
            if row is None:
                continue
            scale = 100.0 if metric.endswith("exact_match") else 1.0
            d = row["delta"]
            value = d["value"] * scale
            err = [[value - d["lo"] * scale], [d["hi"] * scale - value]]
            color = "tab:green" if row.get("within_budget", True) else "tab:red"
            ax.errorbar(value, y, xerr=err, fmt="o", color=color, capsize=3)
            if "bar" in row:  # bar as a delta against fp16's 100
                ax.plot(row["bar"] - 100.0, y, "k|", markersize=14)
            elif row.get("budget", {}).get("rule") == "min_delta":
                ax.axvline(row["budget"]["value"] * scale, color="k", ls="--", lw=0.8)
        ax.axvline(0.0, color="grey", lw=0.8)
        ax.set_yticks(range(len(labels)))
        ax.set_yticklabels(labels, fontsize=7)
        unit = "exact match, points" if metric.endswith("exact_match") else "chrF vs fp16 - 100"
        ax.set_title(f"{family} ({unit})", fontsize=9)
        ax.grid(True, alpha=0.3)
    for ax in list(axes.flat)[len(present) :]:
        ax.axis("off")
    fig.suptitle("per-family delta vs fp16, 95% CI (| = budget bar, red = outside budget)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot_depth(record: Mapping[str, Any], path: Path) -> Path:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(9, 4.5))
    for label, pooled in record["corpus"]["pooled"].items():
        curve = pooled["depth_curve"]
        ax.plot(curve["position"], [max(k, KLD_FLOOR) for k in curve["kld_mean"]], label=label)
    ax.axvline(record["corpus"]["skip"], color="grey", ls=":", lw=1)
    ax.set_yscale("log")
    ax.set_xlabel("position (tokens)")
    ax.set_ylabel("KLD vs fp16, mean over held-out texts")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot_suite(record: Mapping[str, Any], directory: Path) -> list[Path]:
    """Every plot the record has data for, into directory (created)."""
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    if record.get("corpus"):
        written.append(plot_pareto(record, directory / "pareto.png"))
        written.append(plot_depth(record, directory / "depth.png"))
    if record.get("tasks"):
        written.append(plot_families(record, directory / "families.png"))
    return written
