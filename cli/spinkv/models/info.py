"""What `spinkv models list|info` shows about an HF-layout model directory.

The runtime inspects the directory (`_native.inspect_model`: config.json and the safetensors
headers, never the tensor data) with the same rules it loads by, so `models info` describes
exactly the files `run` would load, and a model `run` would refuse (a tensor missing, or stored
in a dtype the loader does not take) is the loader's error here too. The tokenizer and chat
template are loaded as `run` loads them (`check_tokenizer_and_template`), so a tokenizer.json
that does not parse or a template that does not compile is `run`'s error as well.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from spinkv.errors import ModelFormatError, ModelNotFoundError


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
    kv_bytes_per_token: int
    """Bytes of fp16 KV cache per token: K and V, every layer, every KV head."""

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (path as a string)."""
        record = asdict(self)
        record["path"] = str(self.path)
        return record


@dataclass(frozen=True)
class BrokenModel:
    """A model directory in the store that the runtime would refuse to load, and why (the
    loader's own first error, e.g. a missing tensor)."""

    name: str
    path: Path
    problem: str

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict with ModelInfo's keys (null: unknown) and the problem."""
        record: dict[str, Any] = {field: None for field in ModelInfo.__dataclass_fields__}
        record.update(name=self.name, path=str(self.path), problem=self.problem)
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


def weight_files(model_dir: Path) -> list[Path]:
    """The safetensors files the runtime loads for model_dir (its own rule: model.safetensors,
    else the shards its index names). Raises ModelNotFoundError when there are none."""
    return [Path(p) for p in inspect(model_dir)["weight_files"]]


def inspect(model_dir: Path) -> dict[str, Any]:
    """The runtime's view of a model directory, read from config.json and the safetensors
    headers only (`_native.inspect_model`): what it would load, dtype, parameters, shapes."""
    from spinkv import _native

    return dict(_native.inspect_model(str(model_dir)))


def check_tokenizer_and_template(model_dir: Path) -> None:
    """Load model_dir's tokenizer and compile its chat template as `spinkv run` does, raising
    the error `run` would (a tokenizer.json that does not parse, special-token ids outside its
    vocabulary, a template that does not compile)."""
    from spinkv.chat_template import load_chat_template
    from spinkv.tokenizer import load_tokenizer

    load_tokenizer(model_dir)
    load_chat_template(model_dir)


def model_info(path: Path, name: str | None = None) -> ModelInfo:
    """Summarise the model directory at path (name defaults to the directory name)."""
    facts = inspect(Path(path).resolve())
    return ModelInfo(
        name=name or str(facts["name"]),
        path=Path(facts["path"]),
        architecture=str(facts["architecture"]),
        parameters=int(facts["parameters"]),
        dtype=str(facts["dtype"]),
        size_bytes=int(facts["size_bytes"]),
        context_length=int(facts["context_length"]),
        n_layers=int(facts["n_layers"]),
        hidden_size=int(facts["hidden_size"]),
        n_heads=int(facts["n_heads"]),
        n_kv_heads=int(facts["n_kv_heads"]),
        head_dim=int(facts["head_dim"]),
        vocab_size=int(facts["vocab_size"]),
        kv_bytes_per_token=int(facts["kv_bytes_per_token"]),
    )
