"""The Llama tensors spinkv runs, by their HF names, and their GGUF names.

The HF side is what the runtime reads (crates/spinkv-model weights.rs); the GGUF side comes
from the `gguf` package's own tensor-name map, the one llama.cpp's converter uses.
"""

from __future__ import annotations

import functools

LLAMA_GLOBAL = ("model.embed_tokens.weight", "model.norm.weight", "lm_head.weight")
LLAMA_BLOCK = (
    "self_attn.q_proj",
    "self_attn.k_proj",
    "self_attn.v_proj",
    "self_attn.o_proj",
    "mlp.gate_proj",
    "mlp.up_proj",
    "mlp.down_proj",
    "input_layernorm",
    "post_attention_layernorm",
)
OPTIONAL = frozenset(["lm_head.weight"])
"""Absent when the output projection is tied to the embeddings."""


@functools.lru_cache(maxsize=8)
def hf_to_gguf(n_layers: int) -> dict[str, str]:
    """HF name -> GGUF name of every tensor of an n_layers Llama."""
    import gguf

    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, n_layers)
    hf = [*LLAMA_GLOBAL]
    hf += [f"model.layers.{i}.{part}.weight" for i in range(n_layers) for part in LLAMA_BLOCK]
    mapping = {}
    for name in hf:
        mapped = names.get_name(name, try_suffixes=(".weight",))
        if mapped is None:
            raise RuntimeError(f"the gguf package has no Llama name for {name}")
        mapping[name] = mapped
    return mapping


@functools.lru_cache(maxsize=8)
def gguf_to_hf(n_layers: int) -> dict[str, str]:
    """GGUF name -> HF name (the inverse of hf_to_gguf)."""
    return {gguf_name: hf_name for hf_name, gguf_name in hf_to_gguf(n_layers).items()}
