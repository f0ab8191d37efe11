"""KV arms for `spinkv eval`: a preset plus settings, parsed from "turbo:window=0,kivi4"."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from spinkv import _native
from spinkv.errors import InvalidInputError

REFERENCE = "fp16"
REFERENCE_KV: dict[str, Any] = {"preset": "fp16"}


@dataclass(frozen=True)
class KvArm:
    """One cache configuration under test: a label and the `kv` dict for Model.session."""

    label: str
    kv: dict[str, Any]


def parse_arms(spec: str, overrides: Mapping[str, Any] | None = None) -> list[KvArm]:
    """Arms from "turbo,kivi2" or with per-arm settings "turbo:window=0:sink_tokens=4".

    overrides (from --k-bits, --kv-window, ...) apply to every arm except plain fp16; an
    arm's own settings win over them."""
    arms: list[KvArm] = []
    common = {k: v for k, v in (overrides or {}).items() if v is not None}
    for entry in (part.strip() for part in spec.split(",")):
        if not entry:
            continue
        own = dict(_native.parse_kv_spec(entry))  # preset first, then settings as written
        kv: dict[str, Any] = {"preset": own.pop("preset")}
        if kv["preset"] != REFERENCE:
            kv.update(common)
        kv.update(own)
        arms.append(KvArm(arm_label(kv), kv))
    if not arms:
        raise InvalidInputError("no KV preset given (e.g. --kv turbo,kivi4)")
    labels = [arm.label for arm in arms]
    if len(set(labels)) != len(labels):
        raise InvalidInputError(f"a KV arm is listed twice: {', '.join(labels)}")
    return arms


def arm_label(kv: Mapping[str, Any]) -> str:
    """preset[:key=value...] in a stable order, parseable by parse_arms."""
    settings = [f"{k}={_fmt(v)}" for k, v in kv.items() if k != "preset"]
    return ":".join([str(kv["preset"]), *settings])


def _fmt(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)
