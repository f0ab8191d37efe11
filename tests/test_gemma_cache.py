"""Gemma 3's sliding-window (local) layers in the KV cache, on the tiny random Gemma 3 fixture
(tests/fixtures/families/gemma3: window 6 on layers 0, 1 and 3, layer 2 global): local layers
recycle their pages and stay fp16 whatever the preset, their logits still match transformers',
and a saved session with recycled layers loads and goes on identically. No Gemma download."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from spinkv import api

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "families" / "gemma3"
WINDOW = 6
LOCAL_LAYERS = [0, 1, 3]
# Small pages so the 42-token fixture sequence recycles pages of the local layers.
PAGE = 8


def kv(preset: str, **options: int) -> dict[str, object]:
    return {"preset": preset, "page_tokens": PAGE, **options}


@pytest.fixture(scope="module")
def gemma() -> tuple[api.LoadedModel, dict[str, np.ndarray]]:
    with np.load(FIXTURE / "reference.npz") as data:
        reference = {key: data[key] for key in data.files}
    return api.load(FIXTURE), reference


def test_recycled_local_layers_still_match_transformers(
    gemma: tuple[api.LoadedModel, dict[str, np.ndarray]],
) -> None:
    model, reference = gemma
    session = model.session(kv("fp16"))
    steps = []
    for token in reference["tokens"].tolist():
        session.decode(token)
        steps.append(np.asarray(session.logits()))
    diff = float(np.abs(np.stack(steps) - reference["decode_fp16_kv"]).max())
    assert diff <= 1e-3, f"step-by-step with recycled pages: max |Δlogit| {diff:.2e}"
    stats = session.cache_stats()
    assert [layer["window"] for layer in stats["layers"]] == [WINDOW, WINDOW, 0, WINDOW]
    for i in LOCAL_LAYERS:
        assert stats["layers"][i]["recycled_tokens"] > 0
    assert stats["layers"][2]["recycled_tokens"] == 0


@pytest.mark.parametrize("preset", ["turbo", "kivi4"])
def test_local_layers_stay_fp16_and_hold_only_their_window(
    gemma: tuple[api.LoadedModel, dict[str, np.ndarray]], preset: str
) -> None:
    model, _ = gemma
    session = model.session(
        kv(preset, window=8, sink_tokens=0, **({"kivi_group": PAGE} if preset == "kivi4" else {}))
    )
    ids = list(range(3, 203))
    session.prefill(ids[:100])
    for token in ids[100:]:
        session.decode(token)
    stats = session.cache_stats()
    for i, layer in enumerate(stats["layers"]):
        assert layer["tokens"] == 200
        if i in LOCAL_LAYERS:
            assert layer["compressed_tokens"] == 0
            # window + two pages of slack (one being filled)
            assert layer["fp16_tokens"] <= WINDOW + 3 * PAGE, layer
            assert layer["fp16_tokens"] + layer["recycled_tokens"] == 200
        else:
            assert layer["compressed_tokens"] > 0
            assert layer["recycled_tokens"] == 0
    from spinkv.kv.command import accounting_problems, layer_kinds

    assert accounting_problems(stats) == []
    kinds = {group["kind"]: group for group in layer_kinds(stats)}
    assert kinds[f"local (window {WINDOW})"]["layers"] == 3
    assert kinds["global (full attention)"]["compressed_tokens"] > 0


def test_a_saved_session_with_recycled_layers_goes_on_identically(
    gemma: tuple[api.LoadedModel, dict[str, np.ndarray]], tmp_path: Path
) -> None:
    model, reference = gemma
    spec = kv("turbo", window=8)
    tokens = reference["tokens"].tolist()
    original = model.session(spec)
    original.prefill(tokens[:30])
    path = tmp_path / "gemma.spkv"
    original.save(str(path), "{}")
    restored = model.session(spec)
    restored.load(str(path))
    assert restored.state_digest() == original.state_digest()
    for key in ("layers", "total", "tokens"):
        assert restored.cache_stats()[key] == original.cache_stats()[key]
    for token in tokens[30:]:
        original.decode(token)
        restored.decode(token)
        assert np.array_equal(np.asarray(original.logits()), np.asarray(restored.logits()))


def test_a_deep_truncation_re_feeds_and_matches(
    gemma: tuple[api.LoadedModel, dict[str, np.ndarray]],
) -> None:
    """Cutting back past what a local layer kept drops the cache to its start; feeding the
    tokens again gives the logits of a session that never cut."""
    model, reference = gemma
    tokens = reference["tokens"].tolist()
    session = model.session(kv("fp16"))
    for lo in range(0, len(tokens), PAGE):  # blocks: each recycles what the next cannot see
        session.prefill(tokens[lo : lo + PAGE])
    session.truncate(len(tokens) - 1)  # within the slack page: kept
    assert len(session.tokens) == len(tokens) - 1
    session.truncate(20)
    kept = len(session.tokens)
    assert kept < 20
    session.prefill(tokens[kept:])
    fresh = model.session(kv("fp16"))
    fresh.prefill(tokens)
    diff = float(np.abs(np.asarray(session.logits()) - np.asarray(fresh.logits())).max())
    assert diff <= 1e-4


def test_gemma3_turbo_defaults_to_k4_v2_5_unless_set(
    gemma: tuple[api.LoadedModel, dict[str, np.ndarray]], tiny_model_dir: Path
) -> None:
    """Gemma 3's turbo keys get 4 bits by default (its k-norm makes 3.5 too coarse) and its
    values 2.5; bits the user sets win, each on its own, other presets and other families keep
    theirs, and the identity says which."""
    model, _ = gemma

    def bits(loaded: api.LoadedModel, spec: object) -> str:
        return str(loaded.session(spec).identity()["bit_allocation"])

    assert bits(model, None).startswith("turbo k=4 v=2.5 ")
    assert bits(model, "turbo").startswith("turbo k=4 v=2.5 ")
    assert bits(model, {"preset": "turbo", "k_bits": 3.5}).startswith("turbo k=3.5 v=2.5 ")
    assert bits(model, {"preset": "turbo", "v_bits": 3}).startswith("turbo k=4 v=3 ")
    assert bits(model, "kivi2") == "kivi k=2 v=2"
    llama = api.load(tiny_model_dir)
    assert bits(llama, None).startswith("turbo k=3.5 v=3 ")
