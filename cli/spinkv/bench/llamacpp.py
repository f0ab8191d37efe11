"""llama.cpp (through llama-cpp-python) as a `spinkv bench` engine, for side-by-side runs.

It runs the same model (our HF-layout directory written as a GGUF with the same weights, F16
or Q8_0, cached in the store)
on the same token ids, with the same protocol as ours: batches of 512, greedy decoding on the
logits of the last token, the same threads. llama.cpp is measured at its best: an f16 KV cache
with flash attention off and on (on some x86 CPUs its flash-attention decode is 2-4x slower,
on others faster), and its quantized q8_0 / q4_0 caches (which need flash attention). The
anchor at each depth is the faster f16 configuration (`best_reference`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from spinkv.errors import UnsupportedError

INSTALL_HINT = "pip install llama-cpp-python"
N_BATCH = 512
KV_TYPES = ("f16", "q8_0", "q4_0")
"""llama.cpp KV cache types `--llama-kv` accepts."""
DEFAULT_KV_TYPES = KV_TYPES


@dataclass(frozen=True)
class LlamaConfig:
    """One llama.cpp configuration: its KV cache type and flash attention."""

    kv_type: str
    flash_attention: bool

    @property
    def label(self) -> str:
        return f"{self.kv_type} fa-{'on' if self.flash_attention else 'off'}"

    @property
    def is_anchor(self) -> bool:
        """f16-KV configurations are the anchor (a quantized cache trades quality)."""
        return self.kv_type == "f16"


def configs_for(kv_types: Sequence[str]) -> list[LlamaConfig]:
    """The configurations to measure: f16 with flash attention off and on, quantized caches
    with it on (llama.cpp needs flash attention for a quantized V cache)."""
    configs = []
    for kv_type in kv_types:
        if kv_type == "f16":
            configs.append(LlamaConfig("f16", False))
        configs.append(LlamaConfig(kv_type, True))
    return configs


def parse_kv_types(value: str) -> tuple[str, ...]:
    from spinkv.bench.cases import parse_name_list
    from spinkv.errors import InvalidInputError

    names = parse_name_list(value, "--llama-kv")
    unknown = [name for name in names if name not in KV_TYPES]
    if unknown:
        raise InvalidInputError(
            f"--llama-kv {','.join(unknown)}: choose from {', '.join(KV_TYPES)}"
        )
    return names


def require_llama_cpp() -> ModuleType:
    """The llama_cpp module, or UnsupportedError saying how to install it."""
    try:
        import llama_cpp
    except ImportError as exc:
        raise UnsupportedError(
            f"--compare-llama-cpp needs llama-cpp-python, which is not importable ({exc}): "
            f"{INSTALL_HINT}"
        ) from None
    return llama_cpp


def describe(llama_cpp: ModuleType, configs: Sequence[LlamaConfig], gguf_path: Path) -> str:
    version = getattr(llama_cpp, "__version__", "?")
    labels = ", ".join(config.label for config in configs)
    weights = gguf_path.name.rsplit(".", 2)[-2].upper()  # NAME-KEY.f16.gguf
    return f"llama-cpp-python {version}, {weights} weights, KV cache and flash attention: {labels}"


def gguf_for(model_dir: Path) -> Path:
    """The model as a GGUF with the same weights (F16, or Q8_0 for a q8_0 model), converted
    once and kept in <store>/llama-cpp/."""
    from spinkv.models.gguf_export import cached_gguf
    from spinkv.models.store import store_dir

    return cached_gguf(model_dir, store_dir() / "llama-cpp")


class LlamaCppEngine:
    """Engine over llama_cpp.Llama in one configuration; new_context() clears the cache (the
    KV arm is ignored: the configuration fixes llama.cpp's cache)."""

    name = "llama.cpp"

    def __init__(
        self,
        gguf_path: Path,
        *,
        n_ctx: int,
        threads: int,
        config: LlamaConfig = LlamaConfig("f16", True),
    ) -> None:
        llama_cpp = require_llama_cpp()
        self.config = config
        cache_type = getattr(llama_cpp, f"GGML_TYPE_{config.kv_type.upper()}")
        self._llm = llama_cpp.Llama(
            str(gguf_path),
            n_ctx=n_ctx,
            n_batch=N_BATCH,
            n_ubatch=N_BATCH,
            n_threads=threads,
            n_threads_batch=threads,
            type_k=cache_type,
            type_v=cache_type,
            flash_attn=config.flash_attention,
            # Sliding-window layers keep only their window, as llama.cpp's own tools do
            # (llama-cpp-python's default is the full-size cache, which attends over every
            # token and masks most of them away).
            swa_full=False,
            verbose=False,
        )
        self._n_vocab = int(self._llm.n_vocab())
        self._mark = 0

    def close(self) -> None:
        close = getattr(self._llm, "close", None)
        if close is not None:
            close()

    def new_context(self, kv: Mapping[str, Any] | None) -> None:
        self._llm.reset()

    def prefill(self, tokens: list[int]) -> None:
        self._llm.eval(tokens)

    def greedy_next(self) -> int:
        logits = np.ctypeslib.as_array(self._llm._ctx.get_logits(), shape=(self._n_vocab,))
        return int(logits.argmax())

    def decode(self, token: int) -> None:
        self._llm.eval([token])

    def mark(self) -> None:
        self._mark = int(self._llm.n_tokens)

    def restore(self) -> None:
        # Llama.eval drops every cache entry at positions >= n_tokens before it runs.
        self._llm.n_tokens = self._mark

    def timings(self) -> None:
        return None

    def reset_timings(self) -> None:
        pass

    def cache_stats(self) -> None:
        return None
