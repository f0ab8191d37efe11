"""Shared pytest fixtures: the tiny random model, the default model, the native module."""

from __future__ import annotations

import importlib.util
import os
import signal
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

# The tests run from a checkout; a non-editable install (CI's `pip install .`) has no source
# tree of its own, and `spinkv web` builds its wasm bundle from one.
os.environ.setdefault("SPINKV_SOURCE", str(Path(__file__).resolve().parent.parent))

# The Ctrl-C tests interrupt the main thread (and CLI children) with SIGINT; a runner started
# as a background job of a non-interactive shell inherits SIGINT ignored, which would mute them.
signal.signal(signal.SIGINT, signal.default_int_handler)

# The numpy reference runs small matrix products: one BLAS thread is as fast, and several
# threads thrash when the machine's 2 cores are busy (e.g. with the Rust runtime's own pool).
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

ROOT = Path(__file__).resolve().parent.parent
TESTS = Path(__file__).resolve().parent
if str(TESTS) not in sys.path:
    sys.path.insert(0, str(TESTS))  # `import reference`
# Run from a checkout without `pip install .`: the Python sources are under cli/.
if importlib.util.find_spec("spinkv") is None:
    sys.path.insert(0, str(ROOT / "cli"))


def _load_tiny_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("spinkv_models_tiny", ROOT / "models" / "tiny.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


tiny = _load_tiny_module()
make_tiny_model: Callable[..., Path] = tiny.make_tiny_model


@pytest.fixture(scope="session")
def make_tiny(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    """make_tiny(seed=0, dtype="f32", **config_overrides) -> a cached tiny model dir."""
    cache: dict[str, Path] = {}

    def make(seed: int = 0, dtype: str = "f32", **overrides: Any) -> Path:
        key = repr((seed, dtype, sorted(overrides.items())))
        if key not in cache:
            out = tmp_path_factory.mktemp("tiny")
            cache[key] = make_tiny_model(out, seed=seed, dtype=dtype, **overrides)
        return cache[key]

    return make


@pytest.fixture(scope="session")
def tiny_model_dir(make_tiny: Callable[..., Path]) -> Path:
    """The tiny random Llama (f32 weights, untied lm_head) in HF layout."""
    return make_tiny()


@pytest.fixture(scope="session")
def default_model_dir() -> Path:
    """SmolLM2-135M-Instruct from the model store (SPINKV_HOME), imported on first use."""
    from spinkv.errors import SpinkvError
    from spinkv.models.store import resolve_model

    try:
        return resolve_model(None)
    except SpinkvError as exc:
        pytest.skip(f"default model unavailable: {exc}")


@pytest.fixture(scope="session")
def native() -> ModuleType:
    """spinkv._native, or skip when the extension is not built."""
    try:
        from spinkv import _native
    except ImportError as exc:
        pytest.skip(f"spinkv._native cannot be imported ({exc}); build it with `pip install .`")
    return _native


CROSS_SCRIPT = Path(__file__).resolve().parent.parent / "crates/spinkv-kernels/run-cross-tests.sh"


def require_cross_toolchain(isa: str) -> None:
    """Skip (one line saying what is missing) when the NEON ("neon") or SIMD128 ("wasm")
    cross toolchain is not installed; .ci/run installs them and sets SPINKV_REQUIRE_CROSS=1,
    which turns the skip into a failure. SPINKV_SKIP_CROSS=1 skips deliberately."""
    import os
    import subprocess

    if os.environ.get("SPINKV_SKIP_CROSS") == "1":
        pytest.skip("SPINKV_SKIP_CROSS=1")
    done = subprocess.run(
        ["bash", str(CROSS_SCRIPT), "--check", "--only", isa],
        capture_output=True,
        text=True,
        timeout=60,
    )
    if done.returncode == 0:
        return
    lines = (done.stderr + done.stdout).strip().splitlines()
    reason = lines[-1] if lines else f"{isa} cross toolchain check failed"
    if os.environ.get("SPINKV_REQUIRE_CROSS") == "1":
        pytest.fail(f"SPINKV_REQUIRE_CROSS=1 but {reason}")
    pytest.skip(f"{isa} cross toolchain not installed ({reason}); .ci/run installs it")


@pytest.fixture
def spinkv_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """An empty model store for one test (SPINKV_HOME points at it)."""
    home = tmp_path / "spinkv-home"
    monkeypatch.setenv("SPINKV_HOME", str(home))
    yield home


# ---------------------------------------------------------------------------------------------
# A GGUF made from the tiny model the way llama.cpp's converter would (Q/K rows permuted).


def write_gguf_from_hf(
    hf_dir: Path,
    out_path: Path,
    qtype: str = "F32",
    arch: str = "llama",
    raw_override: dict[str, str] | None = None,
) -> Path:
    """Write hf_dir (a tiny-model dir, f32 weights) as a GGUF with matrices in qtype.

    raw_override maps a GGUF tensor name to a GGML type name whose bytes are written as zeros
    (to build files with types the importer must refuse).
    """
    import json

    import gguf
    import numpy as np
    from safetensors.numpy import load_file
    from spinkv.models.gguf_import import permute_qk

    cfg = json.loads((hf_dir / "config.json").read_text())
    tok = json.loads((hf_dir / "tokenizer.json").read_text())
    tok_cfg = json.loads((hf_dir / "tokenizer_config.json").read_text())
    weights = load_file(hf_dir / "model.safetensors")

    w = gguf.GGUFWriter(out_path, arch)
    w.add_name("tiny test model")
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_head_count_kv(cfg["num_key_value_heads"])
    w.add_rope_dimension_count(cfg["head_dim"])
    w.add_rope_freq_base(cfg["rope_theta"])
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_vocab_size(cfg["vocab_size"])
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt2")
    vocab = sorted(tok["model"]["vocab"].items(), key=lambda kv: kv[1])
    specials = {t["content"] for t in tok["added_tokens"] if t["special"]}
    w.add_token_list([t for t, _ in vocab])
    w.add_token_types([3 if t in specials else 1 for t, _ in vocab])
    merges = [m if isinstance(m, str) else " ".join(m) for m in tok["model"]["merges"]]
    w.add_token_merges(merges)
    w.add_bos_token_id(cfg["bos_token_id"])
    w.add_eos_token_id(cfg["eos_token_id"])
    w.add_add_bos_token(False)
    w.add_chat_template(tok_cfg["chat_template"])

    from spinkv.models.tensor_names import hf_to_gguf

    names = hf_to_gguf(cfg["num_hidden_layers"])
    raw_override = raw_override or {}
    for hf_name, array in weights.items():
        name = names[hf_name]
        a = np.asarray(array, dtype=np.float32)
        if "attn_q" in name:
            a = permute_qk(a, cfg["num_attention_heads"])
        elif "attn_k" in name:
            a = permute_qk(a, cfg["num_key_value_heads"])
        if name in raw_override:
            t = gguf.GGMLQuantizationType[raw_override[name]]
            block, size = gguf.GGML_QUANT_SIZES[t]
            raw = np.zeros((a.shape[0], a.shape[1] // block * size), dtype=np.uint8)
            w.add_tensor(name, raw, raw_dtype=t)
        elif a.ndim == 1 or qtype == "F32":
            w.add_tensor(name, a)
        elif qtype == "F16":
            w.add_tensor(name, a.astype(np.float16))
        else:
            t = gguf.GGMLQuantizationType[qtype]
            w.add_tensor(name, gguf.quants.quantize(a, t), raw_dtype=t)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out_path


@pytest.fixture(scope="session")
def make_gguf(
    make_tiny: Callable[..., Path], tmp_path_factory: pytest.TempPathFactory
) -> Callable[..., Path]:
    """make_gguf(qtype="F32", arch="llama", raw_override=None, **tiny_overrides) -> .gguf."""

    def make(
        qtype: str = "F32",
        arch: str = "llama",
        raw_override: dict[str, str] | None = None,
        **overrides: Any,
    ) -> Path:
        out = tmp_path_factory.mktemp("gguf") / f"tiny-{qtype.lower()}.gguf"
        return write_gguf_from_hf(make_tiny(**overrides), out, qtype, arch, raw_override)

    return make
