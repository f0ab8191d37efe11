"""KV arms for `spinkv eval`: a preset plus settings, parsed from "turbo:window=0,kivi4"."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from spinkv.errors import InvalidInputError

PRESETS = ("fp16", "turbo", "turbo-qjl", "kivi2", "kivi4")
REFERENCE = "fp16"
REFERENCE_KV: dict[str, Any] = {"preset": "fp16"}

OVERRIDE_TYPES: dict[str, Callable[[str], Any]] = {
    "k_bits": float,
    "v_bits": float,
    "window": int,
    "page_tokens": int,
    "sink_tokens": int,
    "kivi_group": int,
    "key_norm": str,
    "seed": int,
}
OVERRIDE_ALIASES = {
    "k": "k_bits",
    "v": "v_bits",
    "w": "window",
    "page": "page_tokens",
    "sink": "sink_tokens",
    "sinks": "sink_tokens",
}


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
        preset, *settings = entry.split(":")
        if preset not in PRESETS:
            raise InvalidInputError(
                f"unknown KV preset {preset!r}: choose from {', '.join(PRESETS)}"
            )
        own = dict(_parse_setting(s, entry) for s in settings)
        kv: dict[str, Any] = {"preset": preset}
        if preset != REFERENCE:
            kv.update(common)
        kv.update(own)
        arms.append(KvArm(arm_label(kv), kv))
    if not arms:
        raise InvalidInputError("no KV preset given (e.g. --kv turbo,kivi4)")
    labels = [arm.label for arm in arms]
    if len(set(labels)) != len(labels):
        raise InvalidInputError(f"a KV arm is listed twice: {', '.join(labels)}")
    return arms


def _parse_setting(setting: str, entry: str) -> tuple[str, Any]:
    key, sep, value = setting.partition("=")
    key = OVERRIDE_ALIASES.get(key.strip(), key.strip())
    if not sep or key not in OVERRIDE_TYPES:
        raise InvalidInputError(
            f"bad KV setting {setting!r} in {entry!r}: use key=value with key one of "
            f"{', '.join(OVERRIDE_TYPES)}"
        )
    try:
        return key, OVERRIDE_TYPES[key](value.strip())
    except ValueError as exc:
        raise InvalidInputError(f"bad value for {key} in {entry!r}: {value!r}") from exc


def arm_label(kv: Mapping[str, Any]) -> str:
    """preset[:key=value...] in a stable order, parseable by parse_arms."""
    settings = [f"{k}={_fmt(v)}" for k, v in kv.items() if k != "preset"]
    return ":".join([str(kv["preset"]), *settings])


def _fmt(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)
