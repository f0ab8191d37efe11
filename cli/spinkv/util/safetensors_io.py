"""safetensors files written and read without torch: numpy has no bfloat16, so bf16 is
written as bytes here; tensors are produced one at a time to keep the peak memory low."""

from __future__ import annotations

import json
import struct
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from spinkv.errors import ModelFormatError, UnsupportedError

DTYPES = {
    "f32": ("F32", "float32"),
    "f16": ("F16", "float16"),
    "bf16": ("BF16", "bfloat16"),
    "q8_0": ("I8", "float16"),
}
"""Weight dtypes spinkv writes: name -> (safetensors tag, torch_dtype in config.json). q8_0
writes each matrix whose rows are whole blocks of Q8_BLOCK as I8 codes plus F16 scales
(`NAME` + Q8_SCALE_SUFFIX, one per block, llama.cpp's Q8_0 rule); everything else as f16."""

Q8_BLOCK = 32
Q8_SCALE_SUFFIX = "_scale"


def quantize_q8_0(array: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(int8 codes, float16 scales) of a [rows, k] matrix, k a multiple of Q8_BLOCK, as
    llama.cpp's quantize_row_q8_0_ref: per block d = absmax / 127, codes round(x / d) (half
    away from zero), d stored as f16. A Q8_0 matrix dequantized and quantized again comes back
    unchanged (its absmax is 127·d)."""
    a = np.ascontiguousarray(array, dtype=np.float32)
    blocks = a.reshape(-1, Q8_BLOCK)
    d = np.abs(blocks).max(axis=1) / np.float32(127.0)
    with np.errstate(divide="ignore"):
        inverse = np.where(d > 0, np.float32(1.0) / d, np.float32(0.0)).astype(np.float32)
    scaled = blocks * inverse[:, None]
    codes = np.clip(np.trunc(scaled + np.copysign(np.float32(0.5), scaled)), -127, 127)
    rows = a.shape[0]
    return codes.astype(np.int8).reshape(a.shape), d.astype(np.float16).reshape(rows, -1)


def is_q8_matrix(shape: tuple[int, ...]) -> bool:
    return len(shape) == 2 and shape[1] % Q8_BLOCK == 0


def to_dtype_bytes(array: np.ndarray, dtype: str) -> bytes:
    """Little-endian bytes of array in dtype ("f32", "f16" or "bf16"; bf16 rounds to nearest
    even). Raises UnsupportedError if a value overflows f16."""
    a = np.ascontiguousarray(array, dtype=np.float32)
    if dtype == "f32":
        return a.astype("<f4").tobytes()
    if dtype == "f16":
        h = a.astype("<f2")
        if not np.isfinite(h).all() and np.isfinite(a).all():
            raise UnsupportedError("weights overflow float16; import with dtype 'bf16'")
        return h.tobytes()
    if dtype == "bf16":
        u = a.view(np.uint32).astype(np.uint64)
        rounded = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
        return rounded.astype("<u2").tobytes()
    raise ValueError(f"unknown dtype {dtype!r}; expected one of {', '.join(DTYPES)}")


@dataclass(frozen=True)
class TensorPlan:
    """One tensor to write: its name, shape and a function producing its float values."""

    name: str
    shape: tuple[int, ...]
    produce: Callable[[], np.ndarray]


def write_safetensors(path: Path, plans: Iterable[TensorPlan], dtype: str) -> None:
    """Write a safetensors file, producing one tensor at a time (low peak memory)."""
    plans = list(plans)
    entries = [entry for plan in plans for entry in _stored_entries(plan, dtype)]
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, tag, shape, item in entries:
        nbytes = item * int(np.prod(shape, dtype=np.int64))
        header[name] = {
            "dtype": tag,
            "shape": list(shape),
            "data_offsets": [offset, offset + nbytes],
        }
        offset += nbytes
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)
    from spinkv.util.progress import current

    steps = current()
    steps.start(f"dequantizing and writing {path.name}", len(plans))
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(blob)))
        f.write(blob)
        for plan in plans:
            steps.advance()
            values = plan.produce()
            if tuple(values.shape) != plan.shape:
                raise ModelFormatError(
                    f"tensor {plan.name} has shape {values.shape}, expected {plan.shape}"
                )
            if dtype == "q8_0" and is_q8_matrix(plan.shape):
                codes, scales = quantize_q8_0(values)
                f.write(codes.tobytes())
                f.write(scales.astype("<f2").tobytes())
            else:
                f.write(to_dtype_bytes(values, "f16" if dtype == "q8_0" else dtype))


def _stored_entries(plan: TensorPlan, dtype: str) -> list[tuple[str, str, tuple[int, ...], int]]:
    """(name, safetensors tag, shape, bytes per element) of what one plan writes, in order."""
    if dtype == "q8_0":
        if is_q8_matrix(plan.shape):
            rows, k = plan.shape
            scales = (plan.name + Q8_SCALE_SUFFIX, "F16", (rows, k // Q8_BLOCK), 2)
            return [(plan.name, "I8", plan.shape, 1), scales]
        return [(plan.name, "F16", plan.shape, 2)]
    tag, _ = DTYPES[dtype]
    return [(plan.name, tag, plan.shape, 4 if dtype == "f32" else 2)]


def save_safetensors(path: Path, arrays: Mapping[str, np.ndarray], dtype: str = "f32") -> None:
    """Write in-memory arrays to a safetensors file in dtype ("f32", "f16" or "bf16")."""
    plans = [
        TensorPlan(name, tuple(a.shape), lambda a=a: np.asarray(a)) for name, a in arrays.items()
    ]
    write_safetensors(Path(path), plans, dtype)


def read_safetensors_header(path: Path) -> dict[str, Any]:
    """The JSON header of a safetensors file: tensor name -> {dtype, shape, data_offsets}."""
    try:
        with open(path, "rb") as f:
            raw = f.read(8)
            if len(raw) != 8:
                raise ModelFormatError(f"{path} is truncated (no safetensors header)")
            (n,) = struct.unpack("<Q", raw)
            if n > 100_000_000 or n > path.stat().st_size - 8:
                raise ModelFormatError(f"{path} has a corrupted safetensors header length")
            header = json.loads(f.read(n))
    except OSError as exc:
        raise ModelFormatError(f"cannot read {path}: {exc}") from exc
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ModelFormatError(f"{path} has a corrupted safetensors header") from exc
    if not isinstance(header, dict):
        raise ModelFormatError(f"{path} has a corrupted safetensors header")
    header.pop("__metadata__", None)
    return header
