"""`spinkv cache stats`: the figures agree with each other and with the allocator's count."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from rich.console import Console
from spinkv.cli.app import run_cli
from spinkv.kv.command import accounting_problems, layer_pages, render_cache_stats
from spinkv.util.system import peak_rss_bytes

PRESETS = ["fp16", "turbo", "turbo-qjl", "kivi2", "kivi4"]


@pytest.fixture(scope="module")
def tiny(tiny_model_dir: Path, native: ModuleType) -> Any:
    return native.Model.load(str(tiny_model_dir))


def filled_stats(model: Any, kv: dict[str, Any], tokens: int = 300) -> dict[str, Any]:
    session = model.session(kv)
    ids = [1] + [(7 * i) % 250 + 3 for i in range(tokens - 1)]
    for lo in range(0, tokens, 128):
        session.prefill(ids[lo : lo + 128])
    return dict(session.cache_stats())


@pytest.mark.parametrize("preset", PRESETS)
@pytest.mark.parametrize("window", [0, 64])
def test_figures_agree_with_the_allocator(tiny: Any, preset: str, window: int) -> None:
    stats = filled_stats(tiny, {"preset": preset, "window": window, "page_tokens": 32})
    assert accounting_problems(stats) == []
    layers, total = stats["layers"], stats["total"]
    assert len(layers) == tiny.config["n_layers"]
    for key in ("tokens", "pages_used", "allocated_bytes", "window_bytes"):  # sums over layers
        assert total[key] == sum(layer[key] for layer in layers), key
    # allocated bytes are the pages in use times the native page sizes
    fp16_pages, coded_pages = layer_pages(stats, total)
    assert fp16_pages + coded_pages == total["pages_used"]
    assert total["allocated_bytes"] == (
        fp16_pages * stats["fp16_page_bytes"] + coded_pages * stats["sealed_page_bytes"]
    )
    assert total["pages_used"] == stats["pages_allocated"] - stats["pages_free"]
    assert stats["pool_bytes"] >= total["allocated_bytes"]
    # every token is somewhere, and compression happens only for compressed presets
    for layer in layers:
        assert layer["tokens"] == 300 == layer["compressed_tokens"] + layer["fp16_tokens"]
    if preset == "fp16":
        assert coded_pages == 0 and total["compressed_tokens"] == 0
    else:
        assert coded_pages > 0 and total["bits_per_channel"] < 16.0
        assert fp16_pages * 32 >= window * len(layers)


def test_accounting_problems_catch_disagreement(tiny: Any) -> None:
    stats = filled_stats(tiny, {"preset": "turbo", "window": 0})
    broken = copy.deepcopy(stats)
    broken["layers"][0]["allocated_bytes"] += 16
    problems = accounting_problems(broken)
    assert any("sum over layers" in p for p in problems)
    assert any("layer 0" in p for p in problems)
    broken = copy.deepcopy(stats)
    broken["pages_free"] += 1
    assert any("allocated - free" in p for p in accounting_problems(broken))


def test_render_cache_stats(tiny: Any) -> None:
    stats = filled_stats(tiny, {"preset": "kivi4", "window": 32})
    console = Console(record=True, width=200)
    render_cache_stats(stats, console)
    text = console.export_text()
    assert "KV cache by layer" in text and "total" in text
    assert "all-in bits per channel" in text and "process peak RSS" in text
    assert "mismatch" not in text
    console = Console(record=True, width=200)
    render_cache_stats(stats, console, per_layer=False, peak_rss=None)
    text = console.export_text()
    assert "by layer" not in text and "peak RSS" not in text


def test_peak_rss_is_plausible() -> None:
    assert 10 * 2**20 < peak_rss_bytes() < 64 * 2**30


def test_cli_cache_stats(
    tiny_model_dir: Path, native: ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["cache", "stats", "-m", str(tiny_model_dir), "--kv", "turbo", "--tokens", "200"]
    assert run_cli([*args, "--kv-window", "32", "--sink-tokens", "4", "--json"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert record["kv"] == {"preset": "turbo", "window": 32, "sink_tokens": 4}
    assert record["stats"]["tokens"] == 200
    assert record["accounting_problems"] == []
    assert record["peak_rss_bytes"] > 0
    assert run_cli(args) == 0
    out = capsys.readouterr().out
    assert "KV cache by layer" in out and "compression vs fp16" in out
    assert run_cli([*args, "--tokens", "100000"]) == 2
    assert "exceeds the context" in capsys.readouterr().err
