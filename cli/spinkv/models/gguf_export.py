"""Write a model directory (ours) as a GGUF that llama.cpp loads, with the same weights.

The reverse of `spinkv.models.gguf_import`: HF tensor names become GGUF names, Llama's q_proj /
k_proj rows get llama.cpp's RoPE permutation back (`permute_qk`), Gemma 3's norm gains become
``1 + w`` again, matrices are written as F16 — or as Q8_0, bit for bit the same numbers, when
the model stores them as q8_0 — and norms as F32. The metadata is the source GGUF's own when
the model was imported from one (gguf-metadata.gguf: every key, the tokenizer included);
otherwise, for Llama models, it is written from config.json and the byte-level BPE in
tokenizer.json. Used by `spinkv bench --compare-llama-cpp`, which caches the file in the store.
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
from spinkv.models.gguf_import import METADATA_FILE, copy_metadata, permute_qk
from spinkv.models.info import weight_files
from spinkv.models.tensor_names import hf_to_gguf
from spinkv.util.safetensors_io import Q8_BLOCK, Q8_SCALE_SUFFIX

EXPORT_FORMAT = 4
"""2: the pre-tokenizer tag follows tokenizer.json; 3: q8_0 models as Q8_0; 4: the source
GGUF's metadata when there is one."""
"""Bumped when the written file changes, so cached exports are redone."""
TOKEN_NORMAL, TOKEN_CONTROL, TOKEN_USER_DEFINED = 1, 3, 4


def export_key(model_dir: Path) -> str:
    """Changes whenever the model's config or weight files change."""
    digest = hashlib.sha256(f"export-{EXPORT_FORMAT}".encode())
    digest.update((model_dir / "config.json").read_bytes())
    digest.update((model_dir / "tokenizer.json").read_bytes())
    if (model_dir / METADATA_FILE).is_file():
        digest.update((model_dir / METADATA_FILE).read_bytes())
    for path in weight_files(model_dir):
        st = path.stat()
        digest.update(f"{path.name}:{st.st_size}:{st.st_mtime_ns}".encode())
    return digest.hexdigest()[:12]


def cached_gguf(model_dir: Path, cache_dir: Path) -> Path:
    """The GGUF of model_dir (F16, or Q8_0 for a q8_0 model) in cache_dir, written on first
    use (atomically)."""
    model_dir = Path(model_dir)
    kind = "q8_0" if _is_q8_0(model_dir) else "f16"
    out = cache_dir / f"{model_dir.name}-{export_key(model_dir)}.{kind}.gguf"
    if out.is_file():
        return out
    cache_dir.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".tmp-{uuid.uuid4().hex[:8]}-{out.name}")
    try:
        write_gguf(model_dir, tmp)
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
    return out


def _is_q8_0(model_dir: Path) -> bool:
    from spinkv.util.safetensors_io import read_safetensors_header

    return any(
        tensor.get("dtype") == "I8"
        for path in weight_files(model_dir)
        for tensor in read_safetensors_header(path).values()
        if isinstance(tensor, dict)
    )


def _tensors(model_dir: Path) -> Iterator[tuple[str, np.ndarray, np.ndarray | None]]:
    """(name, values, None) per tensor, or (name, int8 codes, f16 scales) per q8_0 matrix."""
    from safetensors import safe_open

    for path in weight_files(model_dir):
        with safe_open(str(path), framework="numpy") as handle:
            names = set(handle.keys())
            for name in sorted(names):
                if name.endswith(Q8_SCALE_SUFFIX) and name[: -len(Q8_SCALE_SUFFIX)] in names:
                    continue  # written with its matrix
                try:
                    array = handle.get_tensor(name)
                except TypeError as exc:  # numpy has no bfloat16
                    raise UnsupportedError(
                        f"{path.name}: {name} is not f16/f32 ({exc}); re-import the model "
                        "with --dtype f16 to compare with llama.cpp"
                    ) from None
                scales = None
                if array.dtype == np.int8:
                    scale_name = name + Q8_SCALE_SUFFIX
                    if scale_name not in names:
                        raise ModelFormatError(f"{path.name}: {name} has no {scale_name}")
                    scales = handle.get_tensor(scale_name)
                yield name, array, scales


def q8_0_blocks(codes: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """GGUF's Q8_0 layout of a [rows, k] matrix: per block of 32, the f16 scale then the 32
    codes (34 bytes), as a uint8 array [rows, k / 32 * 34]."""
    rows, k = codes.shape
    blocks = np.empty((rows, k // Q8_BLOCK, 2 + Q8_BLOCK), dtype=np.uint8)
    blocks[:, :, :2] = scales.astype("<f2").reshape(rows, -1, 1).view(np.uint8)
    blocks[:, :, 2:] = codes.reshape(rows, -1, Q8_BLOCK).view(np.uint8)
    return blocks.reshape(rows, -1)


def _config(model_dir: Path) -> dict[str, Any]:
    config = json.loads((model_dir / "config.json").read_text())
    if config.get("model_type", "llama") != "llama":
        raise UnsupportedError(f"only Llama models can be exported, not {config['model_type']}")
    if config.get("rope_scaling"):
        raise UnsupportedError("exporting a model with rope_scaling to GGUF is not supported")
    return config


def _add_hyper(writer: Any, config: Mapping[str, Any], *, q8_0: bool = False) -> None:
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
    file_type = gguf.LlamaFileType.MOSTLY_Q8_0 if q8_0 else gguf.LlamaFileType.MOSTLY_F16
    writer.add_file_type(file_type)


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


def _add_tensors(writer: Any, model_dir: Path, config: Mapping[str, Any], arch: str) -> None:
    """Every tensor of model_dir under its GGUF name, in llama.cpp's conventions for arch."""
    import gguf

    heads = int(config["num_attention_heads"])
    kv_heads = int(config.get("num_key_value_heads", heads))
    names = hf_to_gguf(int(config["num_hidden_layers"]), arch)
    for hf_name, array, scales in _tensors(model_dir):
        name = names.get(hf_name)
        if name is None:
            continue  # e.g. rotary inv_freq buffers
        n_head = 0
        if arch == "llama" and name.endswith("attn_q.weight"):
            n_head = heads
        elif arch == "llama" and name.endswith("attn_k.weight"):
            n_head = kv_heads
        if n_head:
            # A row permutation: each row's Q8_0 blocks move with it.
            array = permute_qk(array, n_head)
            scales = None if scales is None else permute_qk(scales, n_head)
        if scales is not None:
            writer.add_tensor(
                name,
                q8_0_blocks(array, scales),
                raw_dtype=gguf.GGMLQuantizationType.Q8_0,
            )
            continue
        if array.ndim == 1:
            array = array.astype(np.float32)
            if arch == "gemma3" and hf_name.endswith("norm.weight"):
                array = array + np.float32(1.0)  # llama.cpp multiplies by the gain itself
            writer.add_tensor(name, np.ascontiguousarray(array))
            continue
        writer.add_tensor(name, np.ascontiguousarray(array, dtype=np.float16))


def _write(writer: Any) -> None:
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()


def write_gguf(model_dir: Path, out_path: Path) -> Path:
    """Write model_dir as a GGUF at out_path: F16 matrices, or Q8_0 where the model has them;
    the source GGUF's metadata when the model was imported from one."""
    import gguf

    if (model_dir / METADATA_FILE).is_file():
        return _write_with_source_metadata(model_dir, out_path)
    config = _config(model_dir)
    writer = gguf.GGUFWriter(str(out_path), "llama")
    try:
        _add_hyper(writer, config, q8_0=_is_q8_0(model_dir))
        _add_tokenizer(writer, model_dir, config)
        _add_tensors(writer, model_dir, config, "llama")
        _write(writer)
    finally:
        writer.close()
    return out_path


def _write_with_source_metadata(model_dir: Path, out_path: Path) -> Path:
    import gguf

    from spinkv.models.gguf_import import GGUFModel

    config = json.loads((model_dir / "config.json").read_text())
    source = GGUFModel(model_dir / METADATA_FILE)
    arch = str(source.require("general.architecture"))
    if arch not in ("llama", "gemma3"):
        raise UnsupportedError(f"cannot export a model of GGUF architecture {arch}")
    writer = gguf.GGUFWriter(str(out_path), arch)
    try:
        # The file type is ours; the source's (e.g. Q4_K_M) would misdescribe the weights.
        copy_metadata(
            source.reader, writer, frozenset(["general.file_type", "general.quantization_version"])
        )
        q8_0 = _is_q8_0(model_dir)
        writer.add_file_type(
            gguf.LlamaFileType.MOSTLY_Q8_0 if q8_0 else gguf.LlamaFileType.MOSTLY_F16
        )
        _add_tensors(writer, model_dir, config, arch)
        _write(writer)
    finally:
        writer.close()
    return out_path
