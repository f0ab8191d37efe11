"""What `spinkv models list|info` shows about an HF-layout model directory.

Everything is read from config.json and the safetensors headers (never the tensor data), so
this is cheap even for large models.
"""

from __future__ import annotations

import json
import struct
from dataclasses import asdict, dataclass
from math import prod
from pathlib import Path
from typing import Any

from spinkv.errors import ModelFormatError, ModelNotFoundError

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"

# safetensors dtype tag -> the name spinkv reports (matches config.json's torch_dtype style).
_DTYPE_NAMES = {"F32": "float32", "F16": "float16", "BF16": "bfloat16", "F64": "float64"}


@dataclass(frozen=True)
class ModelInfo:
    """A summary of one model directory."""

    name: str
    path: Path
    architecture: str
    parameters: int
    dtype: str
    size_bytes: int
    context_length: int
    n_layers: int
    hidden_size: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    vocab_size: int

    @property
    def kv_bytes_per_token(self) -> int:
        """Bytes of fp16 KV cache per token: K and V, every layer, every KV head."""
        return 2 * self.n_layers * self.n_kv_heads * self.head_dim * 2

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (path as a string, kv_bytes_per_token included)."""
        record = asdict(self)
        record["path"] = str(self.path)
        record["kv_bytes_per_token"] = self.kv_bytes_per_token
        return record


def read_json(path: Path) -> dict[str, Any]:
    """Load a JSON object from a file, as ModelFormatError if it is not one."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ModelFormatError(f"cannot read {path}: {exc}") from exc
    if not isinstance(data, dict):
        raise ModelFormatError(f"{path} does not hold a JSON object")
    return data


def load_config(model_dir: Path) -> dict[str, Any]:
    """config.json of a model directory."""
    path = Path(model_dir) / "config.json"
    if not path.is_file():
        raise ModelNotFoundError(f"{model_dir} has no config.json")
    return read_json(path)


def safetensors_files(model_dir: Path) -> list[Path]:
    """The weight files of a model: model.safetensors, or else every shard its index names
    (the runtime's order of preference, crates/spinkv-model weights.rs).

    Raises ModelNotFoundError naming what is missing.
    """
    model_dir = Path(model_dir)
    single = model_dir / SINGLE_FILE
    if single.is_file():
        return [single]
    if single.exists():
        raise ModelFormatError(f"{single} is not a regular file")
    index = model_dir / INDEX_FILE
    if index.is_file():
        weight_map = read_json(index).get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise ModelFormatError(f"{index} has no weight_map")
        shards = [model_dir / name for name in sorted(set(weight_map.values()))]
        odd = [p.name for p in shards if p.exists() and not p.is_file()]
        if odd:
            raise ModelFormatError(f"{model_dir}: not regular files: {', '.join(odd)}")
        missing = [p.name for p in shards if not p.is_file()]
        if missing:
            raise ModelNotFoundError(
                f"{model_dir} is missing safetensors shard(s) named in {INDEX_FILE}: "
                + ", ".join(missing)
            )
        return shards
    raise ModelNotFoundError(f"{model_dir} has no {SINGLE_FILE} (nor {INDEX_FILE})")


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


def _head_dim(config: dict[str, Any]) -> int:
    head_dim = config.get("head_dim")
    if head_dim:
        return int(head_dim)
    heads = int(config["num_attention_heads"])
    if heads <= 0:
        raise ValueError(f"num_attention_heads is {heads}")
    return int(config["hidden_size"]) // heads


def dir_size(path: Path) -> int:
    """Total bytes of the regular files under path."""
    return sum(p.stat().st_size for p in Path(path).rglob("*") if p.is_file())


def model_info(path: Path, name: str | None = None) -> ModelInfo:
    """Summarise the model directory at path (name defaults to the directory name)."""
    path = Path(path).resolve()
    config = load_config(path)
    parameters = 0
    dtype_counts: dict[str, int] = {}
    for file in safetensors_files(path):
        for tensor_name, tensor in read_safetensors_header(file).items():
            try:
                n = prod(int(d) for d in tensor.get("shape", []))
            except (AttributeError, TypeError, ValueError) as exc:
                raise ModelFormatError(f"{file}: tensor {tensor_name} has a bad shape") from exc
            parameters += n
            tag = str(tensor.get("dtype", "?"))
            dtype_counts[tag] = dtype_counts.get(tag, 0) + n
    main_dtype = max(dtype_counts, key=lambda k: dtype_counts[k]) if dtype_counts else "?"
    try:
        architectures = config.get("architectures") or [config.get("model_type", "unknown")]
        return ModelInfo(
            name=name or path.name,
            path=path,
            architecture=str(architectures[0]),
            parameters=parameters,
            dtype=_DTYPE_NAMES.get(main_dtype, main_dtype.lower()),
            size_bytes=dir_size(path),
            context_length=int(config.get("max_position_embeddings", 0)),
            n_layers=int(config["num_hidden_layers"]),
            hidden_size=int(config["hidden_size"]),
            n_heads=int(config["num_attention_heads"]),
            n_kv_heads=int(config.get("num_key_value_heads", config["num_attention_heads"])),
            head_dim=_head_dim(config),
            vocab_size=int(config["vocab_size"]),
        )
    except (KeyError, TypeError, ValueError, OverflowError) as exc:
        raise ModelFormatError(f"{path / 'config.json'} lacks a usable field: {exc}") from exc
