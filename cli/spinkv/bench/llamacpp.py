"""llama.cpp (through llama-cpp-python) as a `spinkv bench` engine, for side-by-side runs.

It runs the same model (our HF-layout directory written as an F16 GGUF, cached in the store)
on the same token ids, with the same protocol as ours: f16 KV cache, flash attention, batches
of 512, greedy decoding on the logits of the last token, 2 threads unless -t says otherwise.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from spinkv.errors import UnsupportedError

INSTALL_HINT = "pip install llama-cpp-python"
N_BATCH = 512


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


def describe(llama_cpp: ModuleType) -> str:
    version = getattr(llama_cpp, "__version__", "?")
    return f"llama-cpp-python {version}, F16 weights, f16 KV cache, flash attention"


def gguf_for(model_dir: Path) -> Path:
    """The model as an F16 GGUF, converted once and kept in <store>/llama-cpp/."""
    from spinkv.models.gguf_export import cached_f16_gguf
    from spinkv.models.store import store_dir

    return cached_f16_gguf(model_dir, store_dir() / "llama-cpp")


class LlamaCppEngine:
    """Engine over llama_cpp.Llama; new_context() clears the cache (the KV arm is ignored:
    llama.cpp always runs with an f16 cache here)."""

    name = "llama.cpp"

    def __init__(self, gguf_path: Path, *, n_ctx: int, threads: int) -> None:
        llama_cpp = require_llama_cpp()
        self._llm = llama_cpp.Llama(
            str(gguf_path),
            n_ctx=n_ctx,
            n_batch=N_BATCH,
            n_ubatch=N_BATCH,
            n_threads=threads,
            n_threads_batch=threads,
            type_k=llama_cpp.GGML_TYPE_F16,
            type_v=llama_cpp.GGML_TYPE_F16,
            flash_attn=True,
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
