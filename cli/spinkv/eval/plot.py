"""`spinkv eval --plot`: KL divergence against depth, one line per KV arm (matplotlib)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from spinkv.errors import InvalidInputError, UnsupportedError

KLD_FLOOR = 1e-5
INSTALL_HINT = "--plot needs matplotlib: pip install 'spinkv[plot]' (or pip install matplotlib)"


def require_matplotlib() -> None:
    """Raise one clear error before a long run if plotting cannot work."""
    try:
        import matplotlib  # noqa: F401
    except ImportError as exc:
        raise UnsupportedError(INSTALL_HINT) from exc


def plot_path(path: Path) -> Path:
    """Where `--plot PATH` writes, checked before a long run: a name without an extension gets
    .png (what matplotlib would write anyway), an extension matplotlib cannot write is an
    error."""
    require_matplotlib()
    from matplotlib.backend_bases import FigureCanvasBase

    path = Path(path)
    if not path.suffix:
        return path.with_name(path.name + ".png")
    supported = FigureCanvasBase.get_supported_filetypes()
    if path.suffix.lower().lstrip(".") not in supported:
        raise InvalidInputError(
            f"--plot {path}: matplotlib cannot write {path.suffix} files "
            f"(use one of {', '.join('.' + k for k in sorted(supported))})"
        )
    return path


def plot_depth(record: Mapping[str, Any], path: Path) -> Path:
    """Per-bucket mean KLD (log scale) and top-1 agreement against position."""
    require_matplotlib()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    kld = record.get("kld")
    if not kld:
        raise UnsupportedError("--plot needs the kld part (drop --only or include kld)")
    fig, (ax_kld, ax_top1) = plt.subplots(2, 1, figsize=(9, 7), sharex=True)
    for arm in kld["arms"]:
        curve = arm["depth_curve"]
        ax_kld.plot(curve["position"], curve["kld_mean"], label=arm["label"], linewidth=1.4)
        ax_top1.plot(curve["position"], [100 * x for x in curve["top1"]], linewidth=1.4)
    bucket = kld["arms"][0]["depth_curve"]["bucket"]
    for ax in (ax_kld, ax_top1):
        ax.axvline(kld["skip"], color="grey", linestyle=":", linewidth=1)
        ax.grid(True, alpha=0.3)
    ax_kld.set_yscale("log")
    peak = max((max(a["depth_curve"]["kld_mean"], default=0.0) for a in kld["arms"]), default=0.0)
    if peak > 1e-3:  # an fp16 arm (~1e-12) would otherwise squash the curves that matter
        ax_kld.set_ylim(bottom=KLD_FLOOR)
    ax_kld.set_ylabel(f"KL(fp16 || arm), mean per {bucket} tokens")
    ax_top1.set_ylabel("top-1 agreement %")
    ax_top1.set_xlabel("position (tokens)")
    model = record.get("model", {}).get("name", "")
    ax_kld.set_title(f"KV cache error against depth: {model}, {Path(kld['text']).name}")
    ax_kld.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
