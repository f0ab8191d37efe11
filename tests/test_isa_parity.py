"""Greedy decoding picks the same tokens on every ISA this machine can run (issue 4).

The kernels follow one canonical operation order (spinkv-kernels' `canon`: 16 fused
multiply-add lanes per reduction, one reduction tree, one exp polynomial), so the logits are
bit-identical across scalar, AVX2, AVX-512 (and NEON), and the greedy tokens with them.

Arms: the fp16 and turbo presets, and turbo with a 16-token window and 16-token pages so that
compressed pages are written and read within the first tokens (with the preset's 128-token
window a short run never seals a page).

Every ISA, the scalar reference included, decodes 64 tokens (scalar takes ~20 s an arm);
SPINKV_PARITY_SCALAR_TOKENS=12 shortens the scalar runs for a quick local check.
"""

from __future__ import annotations

import os
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

TOKENS = 64
SCALAR_TOKENS = int(os.environ.get("SPINKV_PARITY_SCALAR_TOKENS", str(TOKENS)))
ARMS = {
    "fp16": {"preset": "fp16"},
    "turbo": {"preset": "turbo"},
    "turbo-sealed": {"preset": "turbo", "window": 16, "page_tokens": 16},
}


def prompt_tokens(model_dir: Path, n: int = 24) -> list[int]:
    from spinkv.tokenizer import load_tokenizer

    licence = Path("/usr/share/common-licenses/GPL-3")
    text = (
        licence.read_text()[:400]
        if licence.exists()
        else "The licenses for most software are designed to take away your freedom to share it."
    )
    return load_tokenizer(model_dir).encode(text)[:n]


def greedy(model, tokens: list[int], n: int, kv: dict) -> tuple[list[int], np.ndarray]:
    """n greedy tokens after `tokens`, and the logits after the prompt."""
    session = model.session(kv=kv)
    session.prefill(tokens)
    first = session.logits().copy()
    out: list[int] = []
    for _ in range(n):
        token = int(np.argmax(session.logits()))
        out.append(token)
        session.decode(token)
    return out, first


@pytest.mark.parametrize("arm", list(ARMS))
def test_greedy_tokens_identical_across_isas(
    native: ModuleType, default_model_dir: Path, arm: str
) -> None:
    isas = list(native.cpu_features())
    assert "scalar" in isas
    initial = native.isa()
    model = native.Model.load(str(default_model_dir))
    tokens = prompt_tokens(default_model_dir)
    runs: dict[str, tuple[list[int], np.ndarray]] = {}
    try:
        for isa in isas:
            native.set_isa(isa)
            n = SCALAR_TOKENS if isa == "scalar" else TOKENS
            runs[isa] = greedy(model, tokens, n, ARMS[arm])
    finally:
        native.set_isa(initial)
    reference_isa = next(isa for isa in isas if isa != "scalar") if len(isas) > 1 else "scalar"
    reference_tokens, reference_logits = runs[reference_isa]
    assert len(set(reference_tokens)) > 4, "degenerate continuation: the test would prove little"
    for isa, (got, logits) in runs.items():
        assert got == reference_tokens[: len(got)], f"{arm}: {isa} diverges from {reference_isa}"
        assert np.array_equal(logits, reference_logits), f"{arm}: {isa} logits differ"


def test_forcing_an_unknown_or_missing_isa_is_an_error(native: ModuleType) -> None:
    with pytest.raises(Exception, match="unknown ISA"):
        native.set_isa("sse9")
    foreign = "neon" if "avx2" in native.cpu_features() else "avx2"
    with pytest.raises(Exception, match="does not support"):
        native.set_isa(foreign)
