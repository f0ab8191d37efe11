"""Import a Llama or Gemma 3 GGUF file as an HF-layout model directory.

The directory holds model.safetensors (f16, bf16 or f32), config.json, generation_config.json,
tokenizer.json (built with `tokenizers` from the GGUF vocab), tokenizer_config.json (with the
chat template), spinkv.json (where it came from) and gguf-metadata.gguf (the source's metadata
without tensors, so that `spinkv bench` can hand llama.cpp the same model). It is written into
a temporary directory beside its destination and renamed into place, so a failure leaves
nothing half-written.

GGUF conventions undone here:
- dims are stored reversed (ne0 = columns); the reader's numpy arrays are already [rows, cols];
- llama.cpp's converter permutes the rows of Llama's q_proj/k_proj to suit its RoPE layout,
  ``w.reshape(n_head, 2, d // n_head // 2, *rest).swapaxes(1, 2).reshape(w.shape)`` (Gemma's
  NEOX-style RoPE needs no permutation);
- for Gemma it stores every RMSNorm gain as ``1 + w`` (llama.cpp's norm multiplies by the gain;
  HF's Gemma norm multiplies by ``1 + w``): the import subtracts the 1 again, as transformers'
  own GGUF loader does.
Gemma 3 facts the GGUF does not carry are llama.cpp's (src/llama-model.cpp, LLM_ARCH_GEMMA3):
every 6th layer global, the others sliding-window; RoPE base 10,000 on sliding layers;
attention scale 1/sqrt(head_dim) (query_pre_attn_scalar = head_dim) below 27B.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from spinkv.errors import (
    InvalidInputError,
    ModelFormatError,
    ModelNotFoundError,
    SpinkvError,
    UnsupportedError,
)
from spinkv.models.gguf_check import check_gguf_layout
from spinkv.models.tensor_names import OPTIONAL, gguf_to_hf
from spinkv.util.safetensors_io import DTYPES, TensorPlan, write_safetensors

SUPPORTED_ARCHITECTURES = ("llama", "gemma3")
GEMMA3_SLIDING_PATTERN = 6
GEMMA3_LOCAL_ROPE_BASE = 10000.0
SOURCE_FILE = "spinkv.json"
METADATA_FILE = "gguf-metadata.gguf"
"""Every metadata key of the source GGUF, no tensors: what llama.cpp needs besides the weights
to run the model again (e.g. a SentencePiece vocabulary with its scores), for gguf_export."""
# Bump when the import writes different files: the store then redoes older imports.
IMPORT_FORMAT = 1

# Tensor types we dequantize (gguf.quants does the work). Others are refused by name.
SUPPORTED_QUANT_TYPES = frozenset(
    [
        "F32",
        "F16",
        "BF16",
        "F64",
        "Q8_0",
        "Q4_0",
        "Q4_1",
        "Q5_0",
        "Q5_1",
        "Q2_K",
        "Q3_K",
        "Q4_K",
        "Q5_K",
        "Q6_K",
    ]
)

_BLOCK_RE = re.compile(r"^blk\.(\d+)\.")
"""GGUF's per-layer tensor prefix: counts the layers a file holds."""

# GGUF token types (llama.cpp's llama_token_type) that the tokenizer build looks at.
TOKEN_NORMAL = 1
TOKEN_CONTROL = 3  # special tokens: <|im_start|>, <|endoftext|>, ...
TOKEN_USER_DEFINED = 4  # added tokens matched verbatim but not special

# Pre-tokenizer regexes of tokenizer.ggml.pre tags (from each model's own tokenizer.json).
LLAMA3_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
QWEN2_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_PRE_GPT2 = ("default", "gpt2", "mpt", "olmo", "jais")
_PRE_DIGITS_GPT2 = ("smollm", "starcoder", "refact", "codeshell", "command-r", "exaone", "minerva")
_PRE_LLAMA3 = ("llama-bpe", "llama3", "falcon3", "dbrx", "smaug-bpe")
_PRE_QWEN2 = ("qwen2", "stablelm2", "deepseek-r1-qwen", "megrez")


# --------------------------------------------------------------------------------------------
# GGUF reading


class GGUFModel:
    """Metadata and tensors of a GGUF file, through gguf.GGUFReader."""

    def __init__(self, path: Path) -> None:
        import gguf

        self.path = Path(path)
        if not self.path.is_file():
            raise ModelNotFoundError(f"GGUF file not found: {self.path}")
        check_gguf_layout(self.path)
        try:
            self.reader = gguf.GGUFReader(self.path)
        except Exception as exc:  # the reader raises ValueError, struct.error, IndexError...
            raise ModelFormatError(f"{self.path} is not a valid GGUF file: {exc}") from exc
        self.tensors = {t.name: t for t in self.reader.tensors}

    def get(self, key: str, default: Any = None) -> Any:
        field = self.reader.fields.get(key)
        if field is None:
            return default
        try:
            return field.contents()
        except Exception as exc:
            raise ModelFormatError(f"{self.path}: unreadable metadata field {key}") from exc

    def require(self, key: str) -> Any:
        value = self.get(key)
        if value is None:
            raise ModelFormatError(f"{self.path} lacks GGUF metadata field {key}")
        return value

    def check_type(self, name: str) -> None:
        """Raise UnsupportedError, naming it, if tensor `name` has a type we cannot read."""
        qtype = self.tensors[name].tensor_type
        if qtype.name not in SUPPORTED_QUANT_TYPES:
            raise UnsupportedError(
                f"tensor {name} uses GGUF type {qtype.name}, which spinkv cannot import "
                f"(supported: {', '.join(sorted(SUPPORTED_QUANT_TYPES))})"
            )

    def dequantize(self, name: str) -> np.ndarray:
        """Tensor `name` as float32 with numpy (HF) dims: [rows, cols]."""
        from gguf.quants import dequantize

        self.check_type(name)
        tensor = self.tensors[name]
        qtype = tensor.tensor_type
        try:
            values = dequantize(tensor.data, qtype)
        except Exception as exc:
            raise ModelFormatError(f"cannot dequantize {name} ({qtype.name}): {exc}") from exc
        shape = tuple(int(d) for d in reversed(tensor.shape.tolist()))
        return np.asarray(values, dtype=np.float32).reshape(shape)

    def hf_shape(self, name: str) -> tuple[int, ...]:
        return tuple(int(d) for d in reversed(self.tensors[name].shape.tolist()))


@dataclass(frozen=True)
class LlamaHyper:
    """The hyper-parameters that config.json needs, read from GGUF metadata."""

    n_layers: int
    hidden: int
    intermediate: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    context_length: int
    rope_theta: float
    rms_eps: float
    vocab_size: int
    rope_scaling: dict[str, Any] | None
    arch: str = "llama"
    sliding_window: int | None = None


def _f32_float(value: Any) -> float:
    """The shortest decimal that names the same float32 (GGUF stores 1e-5 as 9.9999997e-06)."""
    return float(str(np.float32(value)))


# Bounds on metadata values, far above any real model's: a value read from a file is
# untrusted, and these keep a hostile one from sizing an allocation or a loop.
MAX_DIM = 1 << 20
MAX_HEADS = 1 << 12
MAX_CONTEXT = 1 << 24


def _int_field(g: GGUFModel, key: str, default: Any, low: int, high: int) -> int:
    """A metadata integer in [low, high], as ModelFormatError naming the key otherwise."""
    value = g.require(key) if default is None else g.get(key, default)
    try:
        number = int(value)
    except (TypeError, ValueError, OverflowError):
        raise ModelFormatError(f"{g.path}: metadata {key} is not an integer: {value!r}") from None
    if isinstance(value, float) and value != number:
        raise ModelFormatError(f"{g.path}: metadata {key} is not an integer: {value!r}")
    if not low <= number <= high:
        raise ModelFormatError(f"{g.path}: metadata {key} = {number} is outside [{low}, {high}]")
    return number


def _positive_float(g: GGUFModel, key: str, default: float) -> float:
    value = g.get(key, default)
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ModelFormatError(f"{g.path}: metadata {key} is not a number: {value!r}") from None
    if not math.isfinite(number) or number <= 0:
        raise ModelFormatError(f"{g.path}: metadata {key} = {number} must be finite and > 0")
    return _f32_float(number)


def _block_count(g: GGUFModel, key: str) -> int:
    """block_count, checked against the blk.N tensors the file actually holds."""
    present = {int(m.group(1)) for m in map(_BLOCK_RE.match, g.tensors) if m}
    n_layers = _int_field(g, key, None, 1, max(1, len(present)))
    if present != set(range(len(present))) or len(present) != n_layers:
        raise ModelFormatError(
            f"{g.path}: metadata {key} = {n_layers} but the file holds blocks for "
            f"{len(present)} layer(s)"
        )
    return n_layers


def read_hyper(g: GGUFModel) -> LlamaHyper:
    arch = g.get("general.architecture")
    if arch not in SUPPORTED_ARCHITECTURES:
        raise UnsupportedError(
            f"GGUF architecture {arch!r} is not supported (supported: "
            f"{', '.join(SUPPORTED_ARCHITECTURES)})"
        )
    p = f"{arch}."
    hidden = _int_field(g, p + "embedding_length", None, 1, MAX_DIM)
    n_heads = _int_field(g, p + "attention.head_count", None, 1, MAX_HEADS)
    n_kv_heads = _int_field(g, p + "attention.head_count_kv", n_heads, 1, n_heads)
    if n_heads % n_kv_heads:
        raise ModelFormatError(
            f"{g.path}: {n_heads} attention heads are not a multiple of {n_kv_heads} KV heads"
        )
    head_dim = _int_field(g, p + "attention.key_length", hidden // n_heads, 1, MAX_DIM)
    rope_dim = _int_field(g, p + "rope.dimension_count", head_dim, 0, MAX_DIM)
    if rope_dim != head_dim:
        raise UnsupportedError(f"partial rotary embedding (rope dim {rope_dim} of {head_dim})")
    if "rope_freqs.weight" in g.tensors:
        raise UnsupportedError("RoPE frequency factors (llama3-style rope scaling)")
    scaling_type = g.get(p + "rope.scaling.type", "none")
    factor = g.get(p + "rope.scaling.factor", g.get(p + "rope.scale_linear"))
    rope_scaling = None
    if scaling_type == "linear" or (scaling_type == "none" and factor not in (None, 1.0)):
        scale = _positive_float(g, p + "rope.scaling.factor", float(factor or 1.0))
        rope_scaling = {"rope_type": "linear", "type": "linear", "factor": scale}
    elif scaling_type != "none":
        raise UnsupportedError(f"RoPE scaling type {scaling_type!r} (supported: none, linear)")
    tokens = g.get("tokenizer.ggml.tokens") or []
    embd = g.tensors.get("token_embd.weight")
    if embd is None:
        raise ModelFormatError(f"{g.path} has no token_embd.weight tensor")
    vocab_default = len(tokens) or g.hf_shape("token_embd.weight")[0]
    sliding_window = None
    if arch == "gemma3":
        sliding_window = _int_field(g, p + "attention.sliding_window", None, 1, MAX_CONTEXT)
    return LlamaHyper(
        arch=str(arch),
        sliding_window=sliding_window,
        n_layers=_block_count(g, p + "block_count"),
        hidden=hidden,
        intermediate=_int_field(g, p + "feed_forward_length", None, 1, MAX_DIM * 8),
        n_heads=n_heads,
        n_kv_heads=n_kv_heads,
        head_dim=head_dim,
        context_length=_int_field(g, p + "context_length", 2048, 1, MAX_CONTEXT),
        rope_theta=_positive_float(g, p + "rope.freq_base", 10000.0),
        rms_eps=_positive_float(g, p + "attention.layer_norm_rms_epsilon", 1e-5),
        vocab_size=_int_field(g, p + "vocab_size", vocab_default, 1, MAX_CONTEXT),
        rope_scaling=rope_scaling,
    )


def unpermute_qk(w: np.ndarray, n_head: int) -> np.ndarray:
    """Undo llama.cpp's row permutation of q_proj/k_proj (n_head = heads of that projection)."""
    rows = w.shape[0]
    return w.reshape(n_head, rows // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def permute_qk(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's permutation (HF layout -> GGUF layout); the inverse of unpermute_qk."""
    rows = w.shape[0]
    return w.reshape(n_head, 2, rows // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def expected_shape(hp: LlamaHyper, hf_name: str) -> tuple[int, ...]:
    """[rows, cols] of an HF tensor, from the hyper-parameters."""
    q, kv = hp.n_heads * hp.head_dim, hp.n_kv_heads * hp.head_dim
    shapes = {
        "embed_tokens": (hp.vocab_size, hp.hidden),
        "lm_head": (hp.vocab_size, hp.hidden),
        "q_proj": (q, hp.hidden),
        "k_proj": (kv, hp.hidden),
        "v_proj": (kv, hp.hidden),
        "o_proj": (hp.hidden, q),
        "gate_proj": (hp.intermediate, hp.hidden),
        "up_proj": (hp.intermediate, hp.hidden),
        "down_proj": (hp.hidden, hp.intermediate),
        "q_norm": (hp.head_dim,),
        "k_norm": (hp.head_dim,),
    }
    return shapes.get(hf_name.split(".")[-2], (hp.hidden,))  # the rest are norms


def tensor_plans(g: GGUFModel, hp: LlamaHyper) -> Iterator[TensorPlan]:
    """What to write for each GGUF tensor, in GGUF order; checks names and shapes."""
    names = gguf_to_hf(hp.n_layers, hp.arch)
    gemma = hp.arch == "gemma3"
    expected = {gguf for gguf, hf in names.items() if hf not in OPTIONAL}
    missing = sorted(expected - set(g.tensors))
    if missing:
        shown = ", ".join(missing[:5]) + (" ..." if len(missing) > 5 else "")
        raise ModelFormatError(f"{g.path} lacks tensors: {shown}")
    unknown = [n for n in g.tensors if n not in names]
    if unknown:
        shown = ", ".join(unknown[:5]) + (" ..." if len(unknown) > 5 else "")
        raise UnsupportedError(f"GGUF tensors that a {hp.arch} model does not have: {shown}")
    for name in g.tensors:
        g.check_type(name)
    for name in g.tensors:
        hf_name = names[name]
        shape = expected_shape(hp, hf_name)
        actual = g.hf_shape(name)
        if actual != shape:
            raise ModelFormatError(f"GGUF tensor {name} is {actual}; the metadata implies {shape}")
        n_head = 0
        if hf_name.endswith("q_proj.weight") and not gemma:
            n_head = hp.n_heads
        elif hf_name.endswith("k_proj.weight") and not gemma:
            n_head = hp.n_kv_heads
        norm_shift = 1.0 if gemma and hf_name.endswith("norm.weight") else 0.0

        def produce(
            name: str = name, n_head: int = n_head, shift: float = norm_shift
        ) -> np.ndarray:
            w = g.dequantize(name)
            if shift:
                w = w - np.float32(shift)
            return unpermute_qk(w, n_head) if n_head else w

        yield TensorPlan(hf_name, g.hf_shape(name), produce)


# --------------------------------------------------------------------------------------------
# tokenizer


def _pre_tokenizer(tag: str) -> tuple[Any, bool]:
    """(pre-tokenizer, ignore_merges) for a tokenizer.ggml.pre tag."""
    from tokenizers import Regex, pre_tokenizers

    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if tag in _PRE_GPT2:
        return byte_level, False
    if tag in _PRE_DIGITS_GPT2:
        digits = pre_tokenizers.Digits(individual_digits=True)
        return pre_tokenizers.Sequence([digits, byte_level]), False
    if tag in _PRE_LLAMA3 or tag in _PRE_QWEN2:
        regex = LLAMA3_REGEX if tag in _PRE_LLAMA3 else QWEN2_REGEX
        split = pre_tokenizers.Split(Regex(regex), behavior="isolated", invert=False)
        raw_bytes = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
        return pre_tokenizers.Sequence([split, raw_bytes]), tag in _PRE_LLAMA3
    raise UnsupportedError(f"GGUF pre-tokenizer {tag!r} is not supported")


def build_tokenizer(g: GGUFModel) -> Any:
    """A `tokenizers.Tokenizer` equivalent to the GGUF's byte-level BPE vocab."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, processors

    kind = g.get("tokenizer.ggml.model")
    if kind == "llama":
        return build_sentencepiece_tokenizer(g)
    if kind != "gpt2":
        raise UnsupportedError(
            f"GGUF tokenizer model {kind!r} is not supported (byte-level BPE 'gpt2', "
            "SentencePiece BPE 'llama')"
        )
    tokens: list[str] = list(g.require("tokenizer.ggml.tokens"))
    types: list[int] = list(g.get("tokenizer.ggml.token_type") or [TOKEN_NORMAL] * len(tokens))
    merges = [tuple(m.split(" ", 1)) for m in g.require("tokenizer.ggml.merges")]
    if len(types) != len(tokens) or any(len(m) != 2 for m in merges):
        raise ModelFormatError(f"{g.path} has an inconsistent tokenizer vocabulary")
    vocab = {tok: i for i, tok in enumerate(tokens)}
    pre, ignore_merges = _pre_tokenizer(g.get("tokenizer.ggml.pre", "default"))
    options = {"ignore_merges": True} if ignore_merges else {}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, **options))
    tok.pre_tokenizer = pre
    tok.decoder = decoders.ByteLevel()
    added = [
        AddedToken(t, special=ty == TOKEN_CONTROL, normalized=False)
        for t, ty in zip(tokens, types)
        if ty in (TOKEN_CONTROL, TOKEN_USER_DEFINED)
    ]
    if added:
        tok.add_tokens(added)
    post: list[Any] = [processors.ByteLevel(trim_offsets=False)]
    bos_id = g.get("tokenizer.ggml.bos_token_id")
    if g.get("tokenizer.ggml.add_bos_token", False) and bos_id is not None:
        bos = tokens[int(bos_id)]
        post.append(
            processors.TemplateProcessing(
                single=f"{bos}:0 $A:0",
                pair=f"{bos}:0 $A:0 {bos}:1 $B:1",
                special_tokens=[(bos, int(bos_id))],
            )
        )
    tok.post_processor = post[0] if len(post) == 1 else processors.Sequence(post)
    return tok


TOKEN_BYTE = 6  # <0xNN>: SentencePiece's byte fallback


def build_sentencepiece_tokenizer(g: GGUFModel) -> Any:
    """A `tokenizers` BPE equivalent to a GGUF SentencePiece-BPE vocab (Gemma's): spaces become
    "▁", pieces merge highest score first (the merge list ranks every split of a piece by the
    piece's score, as transformers' SentencePieceExtractor does), unknown characters fall back
    to <0xNN> byte tokens. CONTROL tokens are special; USER_DEFINED ones match verbatim."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, processors

    tokens: list[str] = list(g.require("tokenizer.ggml.tokens"))
    scores: list[float] = [float(v) for v in g.require("tokenizer.ggml.scores")]
    types: list[int] = list(g.get("tokenizer.ggml.token_type") or [TOKEN_NORMAL] * len(tokens))
    if not len(tokens) == len(scores) == len(types):
        raise ModelFormatError(f"{g.path} has an inconsistent tokenizer vocabulary")
    vocab: dict[str, int] = {}
    for i, tok in enumerate(tokens):
        vocab.setdefault(tok, i)
    mergeable = {t for t, ty in zip(tokens, types) if ty == TOKEN_NORMAL}
    merges: list[tuple[float, int, int, str, str]] = []
    for piece in mergeable:
        for cut in range(1, len(piece)):
            left, right = piece[:cut], piece[cut:]
            if left in mergeable and right in mergeable:
                merges.append((-scores[vocab[piece]], vocab[left], vocab[right], left, right))
    merges.sort()
    unk_id = g.get("tokenizer.ggml.unknown_token_id")
    unk = tokens[int(unk_id)] if unk_id is not None else None
    tok = Tokenizer(
        models.BPE(
            vocab=vocab,
            merges=[(m[3], m[4]) for m in merges],
            unk_token=unk,
            fuse_unk=True,
            byte_fallback=True,
        )
    )
    prefix = "▁" if g.get("tokenizer.ggml.add_space_prefix", False) else ""
    steps: list[Any] = [normalizers.Prepend(prefix)] if prefix else []
    tok.normalizer = normalizers.Sequence([*steps, normalizers.Replace(" ", "▁")])
    tok.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
    )
    added = [
        AddedToken(t, special=ty == TOKEN_CONTROL, normalized=False)
        for t, ty in zip(tokens, types)
        if ty in (TOKEN_CONTROL, TOKEN_USER_DEFINED)
    ]
    if added:
        tok.add_tokens(added)
    bos_id = g.get("tokenizer.ggml.bos_token_id")
    if g.get("tokenizer.ggml.add_bos_token", False) and bos_id is not None:
        bos = tokens[int(bos_id)]
        tok.post_processor = processors.TemplateProcessing(
            single=f"{bos}:0 $A:0",
            pair=f"{bos}:0 $A:0 {bos}:1 $B:1",
            special_tokens=[(bos, int(bos_id))],
        )
    return tok


# --------------------------------------------------------------------------------------------
# config files


def _token(tokens: list[str], token_id: Any) -> str | None:
    if token_id is None or not 0 <= int(token_id) < len(tokens):
        return None
    return tokens[int(token_id)]


SPECIAL_TOKEN_KEYS = tuple(
    f"tokenizer.ggml.{kind}_token_id"
    for kind in ("bos", "eos", "eot", "eom", "unknown", "padding", "seperator", "cls", "mask")
)


def _check_special_ids(g: GGUFModel, n_tokens: int) -> None:
    """Every special token id the file names is an integer token of its vocabulary."""
    for key in SPECIAL_TOKEN_KEYS:
        value = g.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            raise ModelFormatError(f"{g.path}: metadata {key} is not an integer: {value!r}")
        if not 0 <= int(value) < n_tokens:
            raise ModelFormatError(
                f"{g.path}: metadata {key} = {value} is not a token of its {n_tokens}-token "
                "vocabulary"
            )


def config_files(g: GGUFModel, hp: LlamaHyper, dtype: str) -> dict[str, dict[str, Any]]:
    """config.json, generation_config.json and tokenizer_config.json contents."""
    tokens: list[str] = list(g.get("tokenizer.ggml.tokens") or [])
    _check_special_ids(g, len(tokens))
    bos_id = g.get("tokenizer.ggml.bos_token_id")
    eos_id = g.get("tokenizer.ggml.eos_token_id")
    stop_ids = [
        int(i)
        for i in (
            eos_id,
            g.get("tokenizer.ggml.eot_token_id"),
            g.get("tokenizer.ggml.eom_token_id"),
        )
        if i is not None
    ]
    stop_ids = list(dict.fromkeys(stop_ids))
    torch_dtype = DTYPES[dtype][1]
    if hp.arch == "gemma3":
        config = gemma3_config(g, hp)
        config.update(
            bos_token_id=None if bos_id is None else int(bos_id),
            eos_token_id=stop_ids[0] if len(stop_ids) == 1 else (stop_ids or None),
            torch_dtype=torch_dtype,
        )
        return _with_tokenizer_files(g, hp, config, tokens, bos_id, eos_id)
    config: dict[str, Any] = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": hp.hidden,
        "intermediate_size": hp.intermediate,
        "num_hidden_layers": hp.n_layers,
        "num_attention_heads": hp.n_heads,
        "num_key_value_heads": hp.n_kv_heads,
        "head_dim": hp.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": hp.context_length,
        "rms_norm_eps": hp.rms_eps,
        "rope_theta": hp.rope_theta,
        "rope_scaling": hp.rope_scaling,
        "vocab_size": hp.vocab_size,
        "tie_word_embeddings": "output.weight" not in g.tensors,
        "attention_bias": False,
        "mlp_bias": False,
        "bos_token_id": None if bos_id is None else int(bos_id),
        "eos_token_id": stop_ids[0] if len(stop_ids) == 1 else (stop_ids or None),
        "torch_dtype": torch_dtype,
    }
    return _with_tokenizer_files(g, hp, config, tokens, bos_id, eos_id)


def gemma3_config(g: GGUFModel, hp: LlamaHyper) -> dict[str, Any]:
    """config.json of a Gemma3ForCausalLM (the GGUF's facts plus llama.cpp's Gemma 3 rules)."""
    layer_types = [
        "full_attention" if (i + 1) % GEMMA3_SLIDING_PATTERN == 0 else "sliding_attention"
        for i in range(hp.n_layers)
    ]
    return {
        "architectures": ["Gemma3ForCausalLM"],
        "model_type": "gemma3_text",
        "hidden_size": hp.hidden,
        "intermediate_size": hp.intermediate,
        "num_hidden_layers": hp.n_layers,
        "num_attention_heads": hp.n_heads,
        "num_key_value_heads": hp.n_kv_heads,
        "head_dim": hp.head_dim,
        "query_pre_attn_scalar": hp.head_dim,
        "hidden_activation": "gelu_pytorch_tanh",
        "max_position_embeddings": hp.context_length,
        "rms_norm_eps": hp.rms_eps,
        "rope_theta": hp.rope_theta,
        "rope_scaling": hp.rope_scaling,
        "rope_local_base_freq": GEMMA3_LOCAL_ROPE_BASE,
        "sliding_window": hp.sliding_window,
        "layer_types": layer_types,
        "final_logit_softcapping": None,
        "attn_logit_softcapping": None,
        "vocab_size": hp.vocab_size,
        "tie_word_embeddings": "output.weight" not in g.tensors,
        "attention_bias": False,
    }


def _with_tokenizer_files(
    g: GGUFModel,
    hp: LlamaHyper,
    config: dict[str, Any],
    tokens: list[str],
    bos_id: Any,
    eos_id: Any,
) -> dict[str, dict[str, Any]]:
    """config.json plus the generation and tokenizer configs every import writes."""
    generation = {
        "bos_token_id": config["bos_token_id"],
        "eos_token_id": config["eos_token_id"],
    }
    pad_id = g.get("tokenizer.ggml.padding_token_id")
    if pad_id is not None:
        generation["pad_token_id"] = int(pad_id)
    tokenizer_config: dict[str, Any] = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "add_bos_token": bool(g.get("tokenizer.ggml.add_bos_token", False)),
        "add_eos_token": bool(g.get("tokenizer.ggml.add_eos_token", False)),
        "bos_token": _token(tokens, bos_id),
        "eos_token": _token(tokens, eos_id),
        "unk_token": _token(tokens, g.get("tokenizer.ggml.unknown_token_id")),
        "pad_token": _token(tokens, pad_id),
        "model_max_length": hp.context_length,
        "clean_up_tokenization_spaces": False,
    }
    template = g.get("tokenizer.chat_template")
    if template:
        tokenizer_config["chat_template"] = str(template)
    return {
        "config.json": config,
        "generation_config.json": generation,
        "tokenizer_config.json": tokenizer_config,
    }


# --------------------------------------------------------------------------------------------
# the import


def sanitize_name(name: str) -> str:
    """A store directory name: lower case, [a-z0-9._-], not starting with a dot."""
    clean = re.sub(r"[^a-z0-9._-]+", "-", name.strip().lower()).strip("-.")
    if not clean:
        raise InvalidInputError(f"invalid model name {name!r}")
    return clean


def store_name_for(path: Path) -> str:
    """The store name a GGUF file gets by default: its file name without .gguf, cut to the
    store's 100 characters."""
    try:
        clean = sanitize_name(re.sub(r"\.gguf$", "", Path(path).name, flags=re.IGNORECASE))
    except InvalidInputError:
        clean = ""
    return clean[:100].lstrip("_").rstrip("-.") or "model"


def source_record(path: Path) -> dict[str, Any]:
    """Identity of a source file, to tell whether an import of it is still current."""
    st = path.stat()
    return {
        "kind": "gguf",
        "path": str(path.resolve()),
        "size": st.st_size,
        "mtime_ns": st.st_mtime_ns,
    }


def copy_metadata(reader: Any, writer: Any, skip: frozenset[str] = frozenset()) -> None:
    """Every metadata key of a GGUFReader into a GGUFWriter (made with the same
    architecture), except the file's own header fields and the keys in skip."""
    import gguf

    for field in reader.fields.values():
        name = field.name
        if name.startswith("GGUF.") or name == gguf.Keys.General.ARCHITECTURE or name in skip:
            continue
        value_type = field.types[0]
        sub_type = field.types[-1] if value_type == gguf.GGUFValueType.ARRAY else None
        try:
            writer.add_key_value(name, field.contents(), value_type, sub_type=sub_type)
        except Exception as exc:  # nested arrays and the like, which no model we run has
            raise ModelFormatError(f"GGUF metadata field {name} cannot be copied: {exc}") from exc


def write_metadata_copy(g: GGUFModel, out: Path) -> None:
    """The source's metadata as a GGUF without tensors (METADATA_FILE)."""
    import gguf

    writer = gguf.GGUFWriter(str(out), str(g.require("general.architecture")))
    try:
        copy_metadata(g.reader, writer)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
    finally:
        writer.close()


def write_model_dir(g: GGUFModel, out: Path, dtype: str, extra: Mapping[str, Any]) -> None:
    """Write every file of the HF-layout directory into out (an existing empty dir)."""
    hp = read_hyper(g)
    files = config_files(g, hp, dtype)
    tokenizer = build_tokenizer(g)
    if tokenizer.get_vocab_size(with_added_tokens=True) != hp.vocab_size:
        raise ModelFormatError(
            f"tokenizer has {tokenizer.get_vocab_size(with_added_tokens=True)} tokens but the "
            f"model's vocab is {hp.vocab_size}"
        )
    write_safetensors(out / "model.safetensors", list(tensor_plans(g, hp)), dtype)
    tokenizer.save(str(out / "tokenizer.json"))
    write_metadata_copy(g, out / METADATA_FILE)
    for filename, content in files.items():
        (out / filename).write_text(json.dumps(content, indent=2, ensure_ascii=False) + "\n")
    record = {"format": IMPORT_FORMAT, "dtype": dtype, "gguf_name": g.get("general.name"), **extra}
    (out / SOURCE_FILE).write_text(json.dumps(record, indent=2) + "\n")


def place_atomically(dest: Path, fill: Callable[[Path], None]) -> Path:
    """Call fill(tmp) on a fresh temporary dir beside dest, then rename it to dest (replacing
    an existing dest). On any failure, nothing is left behind and dest is untouched."""
    from spinkv.util.files import remove_stale_temp_dirs, temp_dir_for

    dest.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temp_dirs(dest.parent)  # left by imports that were killed
    tmp = temp_dir_for(dest)
    tmp.mkdir()
    try:
        fill(tmp)
        if dest.exists() or dest.is_symlink():
            old = temp_dir_for(dest, "old")
            os.replace(dest, old)
            os.replace(tmp, dest)
            if old.is_symlink():  # a link is replaced, never what it points at
                old.unlink()
            else:
                shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return dest


def import_gguf(
    path: os.PathLike[str] | str,
    name: str | None = None,
    dtype: str = "f16",
    *,
    out_dir: Path | None = None,
    source: Mapping[str, Any] | None = None,
    replace: bool = False,
) -> Path:
    """Import a Llama-family GGUF into the model store (or exactly into out_dir).

    name defaults to the file name without .gguf. A registry model's names are refused, and so
    is a name the store already holds for another model unless replace (an earlier import of
    the same file is imported again). dtype is the weight type written: "f16" (default), "bf16"
    or "f32". source overrides the provenance recorded in spinkv.json. Returns the model
    directory.
    """
    if dtype not in DTYPES:
        raise InvalidInputError(f"unknown dtype {dtype!r}; expected one of {', '.join(DTYPES)}")
    path = Path(path).expanduser()
    # None only for a missing file, which GGUFModel below reports.
    record_source = dict(source) if source else source_record(path) if path.is_file() else None
    if out_dir is None:
        from spinkv.models.store import store_placement

        store_name = sanitize_name(name) if name is not None else store_name_for(path)
        out_dir = store_placement(store_name, record_source, replace=replace)
    from spinkv.util.files import tree_size
    from spinkv.util.progress import current

    started = time.perf_counter()
    g = GGUFModel(path)
    record = {"source": record_source}
    try:
        dest = place_atomically(Path(out_dir), lambda tmp: write_model_dir(g, tmp, dtype, record))
    except (SpinkvError, OSError, MemoryError):
        raise
    except Exception as exc:
        # A metadata value of the wrong type or range (a string where an id belongs, an id
        # past the vocabulary, merges that are not strings, a vocabulary `tokenizers` refuses)
        # surfaces as whatever the code that used it raised: it is the file's fault.
        raise ModelFormatError(
            f"{path} cannot be imported: {type(exc).__name__}: {exc}".splitlines()[0]
        ) from exc
    current().finish()
    current().imported(dest.name, dest, tree_size(dest), time.perf_counter() - started)
    return dest
