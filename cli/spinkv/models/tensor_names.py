"""The tensors spinkv runs (Llama and Gemma 3 GGUF imports), by HF and GGUF names.

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
GEMMA3_BLOCK = (
    *LLAMA_BLOCK[:-1],
    "self_attn.q_norm",
    "self_attn.k_norm",
    "post_attention_layernorm",
    "pre_feedforward_layernorm",
    "post_feedforward_layernorm",
)
"""Gemma 3: post_attention_layernorm follows attention; the MLP's input norm is
pre_feedforward_layernorm (GGUF ffn_norm)."""
OPTIONAL = frozenset(["lm_head.weight"])
"""Absent when the output projection is tied to the embeddings."""


@functools.lru_cache(maxsize=8)
def hf_to_gguf(n_layers: int, arch: str = "llama") -> dict[str, str]:
    """HF name -> GGUF name of every tensor of an n_layers model of GGUF architecture arch."""
    import gguf

    model_arch = gguf.MODEL_ARCH.GEMMA3 if arch == "gemma3" else gguf.MODEL_ARCH.LLAMA
    block = GEMMA3_BLOCK if arch == "gemma3" else LLAMA_BLOCK
    names = gguf.get_tensor_name_map(model_arch, n_layers)
    hf = [*LLAMA_GLOBAL]
    hf += [f"model.layers.{i}.{part}.weight" for i in range(n_layers) for part in block]
    mapping = {}
    for name in hf:
        mapped = names.get_name(name, try_suffixes=(".weight",))
        if mapped is None:
            raise RuntimeError(f"the gguf package has no Llama name for {name}")
        mapping[name] = mapped
    return mapping


@functools.lru_cache(maxsize=8)
def gguf_to_hf(n_layers: int, arch: str = "llama") -> dict[str, str]:
    """GGUF name -> HF name (the inverse of hf_to_gguf)."""
    return {gguf_name: hf_name for hf_name, gguf_name in hf_to_gguf(n_layers, arch).items()}
