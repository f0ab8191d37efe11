"""Write an HF-layout Llama directory (ours) as an F16 GGUF that llama.cpp loads.

The reverse of `spinkv.models.gguf_import`: HF tensor names become GGUF names, q_proj / k_proj rows
get llama.cpp's RoPE permutation back (`permute_qk`), matrices are written as F16 and norms
as F32, and the byte-level BPE in tokenizer.json becomes GGUF tokenizer metadata. Used by
`spinkv bench --compare-llama-cpp`, which caches the file in the store.
"""

from __future__ import annotations

import hashlib
import json
import os
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from spinkv.errors import ModelFormatError, UnsupportedError
from spinkv.models.gguf_import import permute_qk
from spinkv.models.info import weight_files
from spinkv.models.tensor_names import hf_to_gguf

EXPORT_FORMAT = 2  # 2: the pre-tokenizer tag follows tokenizer.json
"""Bumped when the written file changes, so cached exports are redone."""
TOKEN_NORMAL, TOKEN_CONTROL, TOKEN_USER_DEFINED = 1, 3, 4


def export_key(model_dir: Path) -> str:
    """Changes whenever the model's config or weight files change."""
    digest = hashlib.sha256(f"export-{EXPORT_FORMAT}".encode())
    digest.update((model_dir / "config.json").read_bytes())
    digest.update((model_dir / "tokenizer.json").read_bytes())
    for path in weight_files(model_dir):
        st = path.stat()
        digest.update(f"{path.name}:{st.st_size}:{st.st_mtime_ns}".encode())
    return digest.hexdigest()[:12]


def cached_f16_gguf(model_dir: Path, cache_dir: Path) -> Path:
    """The F16 GGUF of model_dir in cache_dir, written on first use (atomically)."""
    model_dir = Path(model_dir)
    out = cache_dir / f"{model_dir.name}-{export_key(model_dir)}.f16.gguf"
    if out.is_file():
        return out
    cache_dir.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".tmp-{uuid.uuid4().hex[:8]}-{out.name}")
    try:
        write_f16_gguf(model_dir, tmp)
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
    return out


def _tensors(model_dir: Path) -> Iterator[tuple[str, np.ndarray]]:
    from safetensors import safe_open

    for path in weight_files(model_dir):
        with safe_open(str(path), framework="numpy") as handle:
            for name in handle.keys():  # noqa: SIM118 - safe_open is not a Mapping
                try:
                    yield name, handle.get_tensor(name)
                except TypeError as exc:  # numpy has no bfloat16
                    raise UnsupportedError(
                        f"{path.name}: {name} is not f16/f32 ({exc}); re-import the model "
                        "with --dtype f16 to compare with llama.cpp"
                    ) from None


def _config(model_dir: Path) -> dict[str, Any]:
    config = json.loads((model_dir / "config.json").read_text())
    if config.get("model_type", "llama") != "llama":
        raise UnsupportedError(f"only Llama models can be exported, not {config['model_type']}")
    if config.get("rope_scaling"):
        raise UnsupportedError("exporting a model with rope_scaling to GGUF is not supported")
    return config


def _add_hyper(writer: Any, config: Mapping[str, Any]) -> None:
    import gguf

    hidden, heads = int(config["hidden_size"]), int(config["num_attention_heads"])
    head_dim = int(config.get("head_dim") or hidden // heads)
    writer.add_name(str(config.get("_name_or_path") or "spinkv export"))
    writer.add_block_count(int(config["num_hidden_layers"]))
    writer.add_context_length(int(config.get("max_position_embeddings", 2048)))
    writer.add_embedding_length(hidden)
    writer.add_feed_forward_length(int(config["intermediate_size"]))
    writer.add_head_count(heads)
    writer.add_head_count_kv(int(config.get("num_key_value_heads", heads)))
    writer.add_rope_dimension_count(head_dim)
    if head_dim * heads != hidden:
        writer.add_key_length(head_dim)
        writer.add_value_length(head_dim)
    writer.add_rope_freq_base(float(config.get("rope_theta", 10000.0)))
    writer.add_layer_norm_rms_eps(float(config.get("rms_norm_eps", 1e-5)))
    writer.add_vocab_size(int(config["vocab_size"]))
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16)


def _add_tokenizer(writer: Any, model_dir: Path, config: Mapping[str, Any]) -> None:
    tok = json.loads((model_dir / "tokenizer.json").read_text())
    model = tok.get("model", {})
    if model.get("type") != "BPE" or not isinstance(model.get("vocab"), dict):
        raise UnsupportedError("only byte-level BPE tokenizers can be exported to GGUF")
    by_id: dict[int, str] = {int(i): t for t, i in model["vocab"].items()}
    types: dict[int, int] = {}
    for added in tok.get("added_tokens", []):
        by_id[int(added["id"])] = added["content"]
        types[int(added["id"])] = TOKEN_CONTROL if added.get("special") else TOKEN_USER_DEFINED
    n_vocab = int(config["vocab_size"])
    if max(by_id) >= n_vocab:
        raise ModelFormatError(f"tokenizer ids reach {max(by_id)} but vocab_size is {n_vocab}")
    tokens = [by_id.get(i, f"[PAD{i}]") for i in range(n_vocab)]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(gguf_pre_tag(tok.get("pre_tokenizer")))
    writer.add_token_list(tokens)
    writer.add_token_types([types.get(i, TOKEN_NORMAL) for i in range(n_vocab)])
    writer.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in model["merges"]])
    bos, eos = _first_id(config.get("bos_token_id")), _first_id(config.get("eos_token_id"))
    if bos is not None:
        writer.add_bos_token_id(bos)
    if eos is not None:
        writer.add_eos_token_id(eos)
    writer.add_add_bos_token(False)


def gguf_pre_tag(pre: Any) -> str:
    """The tokenizer.ggml.pre tag under which llama.cpp splits text as tokenizer.json's
    pre-tokenizer does (the inverse of gguf_import's table). A wrong tag makes llama.cpp
    tokenize text differently from us, so an unknown pre-tokenizer is an error."""
    from spinkv.models.gguf_import import LLAMA3_REGEX, QWEN2_REGEX

    pre = pre if isinstance(pre, dict) else {}
    parts = pre.get("pretokenizers", []) if pre.get("type") == "Sequence" else []
    kinds = [p.get("type") for p in parts]
    if pre.get("type") == "ByteLevel" and pre.get("use_regex", True):
        return "default"
    if kinds == ["Digits", "ByteLevel"] and parts[0].get("individual_digits"):
        return "smollm"
    if kinds == ["Split", "ByteLevel"] and not parts[1].get("use_regex", True):
        regex = (parts[0].get("pattern") or {}).get("Regex")
        if regex == LLAMA3_REGEX:
            return "llama-bpe"
        if regex == QWEN2_REGEX:
            return "qwen2"
    raise UnsupportedError(
        "this tokenizer's pre-tokenizer has no llama.cpp equivalent spinkv knows; "
        "the model cannot be exported to GGUF"
    )


def _first_id(value: Any) -> int | None:
    if isinstance(value, list):
        value = value[0] if value else None
    return value if isinstance(value, int) else None


def write_f16_gguf(model_dir: Path, out_path: Path) -> Path:
    """Write model_dir as a GGUF with F16 matrices at out_path."""
    import gguf

    config = _config(model_dir)
    heads = int(config["num_attention_heads"])
    kv_heads = int(config.get("num_key_value_heads", heads))
    writer = gguf.GGUFWriter(str(out_path), "llama")
    try:
        _add_hyper(writer, config)
        _add_tokenizer(writer, model_dir, config)
        names = hf_to_gguf(int(config["num_hidden_layers"]))
        for hf_name, array in _tensors(model_dir):
            name = names.get(hf_name)
            if name is None:
                continue  # e.g. rotary inv_freq buffers
            if name.endswith("attn_q.weight"):
                array = permute_qk(array, heads)
            elif name.endswith("attn_k.weight"):
                array = permute_qk(array, kv_heads)
            dtype = np.float32 if array.ndim == 1 else np.float16
            writer.add_tensor(name, np.ascontiguousarray(array, dtype=dtype))
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
    finally:
        writer.close()
    return out_path
