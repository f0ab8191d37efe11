"""What the browser (or node) runtime needs to know about a model beyond its files: the chat
template with its special tokens, the end-of-turn token ids and the cache identity inputs
computed on the Python side (tokenizer and chat-template hashes), so that a session saved in
the page carries the identity record a CLI session of the same model carries."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from spinkv.chat_template import load_chat_template
from spinkv.errors import ModelNotFoundError
from spinkv.sessions.store import chat_template_hash, tokenizer_hash
from spinkv.tokenizer import load_tokenizer

# The files the page downloads (weights first in size, so progress is meaningful).
MODEL_FILES = (
    "config.json",
    "tokenizer.json",
    "model.safetensors.index.json",
)


def served_files(model_dir: Path) -> list[Path]:
    """config.json, tokenizer.json and the safetensors (single file or shards + index)."""
    files = [model_dir / name for name in MODEL_FILES if (model_dir / name).is_file()]
    files += sorted(model_dir.glob("*.safetensors"))
    names = {f.name for f in files}
    for needed in ("config.json", "tokenizer.json"):
        if needed not in names:
            raise ModelNotFoundError(f"{model_dir} has no {needed}")
    if not any(name.endswith(".safetensors") for name in names):
        raise ModelNotFoundError(f"{model_dir} has no safetensors weights")
    return files


def model_manifest(model_dir: Path, name: str | None = None) -> dict[str, Any]:
    """The JSON the runtime's `load` call takes (minus the file buffers), plus file sizes."""
    model_dir = Path(model_dir)
    tokenizer = load_tokenizer(model_dir)
    template = load_chat_template(model_dir)
    assert template is not None  # fallback=True always gives one
    files = served_files(model_dir)
    return {
        "name": name or model_dir.name,
        "files": [{"name": f.name, "bytes": f.stat().st_size} for f in files],
        "chat_template": {
            "source": template.source,
            "bos_token": template.bos_token,
            "eos_token": template.eos_token,
            "origin": template.origin,
        },
        "eos_token_ids": sorted(tokenizer.eos_token_ids),
        "identity": {
            "tokenizer_hash": tokenizer_hash(model_dir, tokenizer),
            "chat_template_hash": chat_template_hash(template),
        },
    }
