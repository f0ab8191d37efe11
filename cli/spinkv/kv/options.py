"""KV cache options as `Model.session(kv=...)` takes them. The runtime validates values."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Union

from spinkv import _native
from spinkv.errors import InvalidInputError

DEFAULT_KV_PRESET: str = _native.DEFAULT_KV_PRESET
"""The preset used when none is named (the design study's first product mode: K3.5/V3/W128);
the runtime owns it (`KvConfig::default()`), for Python, Rust and the browser alike."""
KV_PRESETS: tuple[str, ...] = tuple(_native.KV_PRESETS)

KvSpec = Union[str, Mapping[str, Any], None]
"""A KV cache preset name ("fp16", "turbo", ...), a dict of cache options, or None (default)."""


def kv_options(
    preset: str | None = None,
    *,
    k_bits: float | None = None,
    v_bits: float | None = None,
    window: int | None = None,
    page_tokens: int | None = None,
    max_context: int | None = None,
    sink_tokens: int | None = None,
    sparse_v: float | None = None,
) -> dict[str, Any] | None:
    """The cache options dict with only the keys given; None when nothing is set."""
    given = {
        "preset": preset,
        "k_bits": k_bits,
        "v_bits": v_bits,
        "window": window,
        "page_tokens": page_tokens,
        "max_context": max_context,
        "sink_tokens": sink_tokens,
        "sparse_v": sparse_v,
    }
    options = {key: value for key, value in given.items() if value is not None}
    return options or None


def kv_dict(kv: KvSpec) -> dict[str, Any] | None:
    """Normalise a KvSpec: a preset name becomes {"preset": name}."""
    if kv is None:
        return None
    if isinstance(kv, str):
        return {"preset": kv}
    if isinstance(kv, Mapping):
        return dict(kv) or None
    raise InvalidInputError(f"invalid kv {kv!r}: expected a preset name or a dict of options")
