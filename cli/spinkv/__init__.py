"""spinkv: a small, fast Llama-family inference runtime with a paged, quantized KV cache.

    import spinkv
    model = spinkv.load()                  # default model: SmolLM2-135M-Instruct
    print(model.generate("What is the capital of France?").text)

The API names below are imported on first use, so `import spinkv.errors` (or the CLI's
--help) does not load the native runtime.
"""

from __future__ import annotations

from importlib import import_module
from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, Any

from spinkv.errors import (
    ChatBusyError,
    ContextOverflowError,
    IdentityMismatchError,
    InternalError,
    InvalidInputError,
    KvCacheError,
    ModelFormatError,
    ModelNotFoundError,
    SessionBusyError,
    SessionFileError,
    SessionPagesError,
    SpinkvError,
    UnsupportedError,
)

try:
    __version__ = version("spinkv")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0.0.0+unknown"

_LAZY = {
    "load": "spinkv.api",
    "kv_options": "spinkv.kv.options",
    "LoadedModel": "spinkv.api",
    "ChatSession": "spinkv.api",
    "ChatMessage": "spinkv.api",
    "GenerationResult": "spinkv.generation",
    "TextStream": "spinkv.generation",
    "FinishReason": "spinkv.generation",
    "SamplingParams": "spinkv.sampling",
    "GenerationTimings": "spinkv.timing",
}

if TYPE_CHECKING:
    from spinkv.api import ChatMessage, ChatSession, LoadedModel, load
    from spinkv.generation import FinishReason, GenerationResult, TextStream
    from spinkv.kv.options import kv_options
    from spinkv.sampling import SamplingParams
    from spinkv.timing import GenerationTimings


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'spinkv' has no attribute {name!r}")
    value = getattr(import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_LAZY])


__all__ = [
    "ChatBusyError",
    "ChatMessage",
    "ChatSession",
    "ContextOverflowError",
    "FinishReason",
    "GenerationResult",
    "GenerationTimings",
    "IdentityMismatchError",
    "InternalError",
    "InvalidInputError",
    "KvCacheError",
    "LoadedModel",
    "ModelFormatError",
    "ModelNotFoundError",
    "SamplingParams",
    "SessionBusyError",
    "SessionFileError",
    "SessionPagesError",
    "SpinkvError",
    "TextStream",
    "UnsupportedError",
    "__version__",
    "kv_options",
    "load",
]
