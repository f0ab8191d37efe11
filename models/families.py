"""Write tiny random-weight models of every family spinkv runs, with transformers' own logits.

    /work/venv-torch/bin/python models/families.py [OUT_DIR]   (default tests/fixtures/families)

Needs torch (CPU) and transformers, which CI does not have: the output is committed, and
tests/test_families.py compares the runtime's logits with the ones written here.

Each model is built by transformers itself (its config class + `from_config`), so the config.json,
tensor names and forward are the library's, with each real family's quirks switched on at small
shapes: Qwen2's Q/K/V biases, Qwen3's per-head Q/K RMSNorm, Llama 3.x's `llama3` RoPE scaling,
Mistral's sliding window (shorter than the test sequence, so the mask matters), Gemma 3's
interleaved local/global layers with their own RoPE bases, (1 + w) norms, GeGLU and the rest.
Weights are random (seeded) and f32; biases and norm gains are random too, not their zero/one
initial values, so that leaving one out changes the logits.

Per family, OUT_DIR/<name>/ holds config.json, model.safetensors, tokenizer.json,
tokenizer_config.json and reference.npz: `tokens` [T] int32, `prefill` [T, vocab] float32 (one
forward over all tokens), `decode` [T, vocab] float32 (one token at a time through a
DynamicCache), and `prefill_fp16_kv` / `decode_fp16_kv`: the same with K (after RoPE) and V
rounded to fp16 inside attention, as spinkv's cache stores them.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tiny import CHATML_TEMPLATE, make_tokenizer  # noqa: E402

VOCAB = 300
SEED = 1234
TEXT = "The capital of France is Paris. Tokens are the pieces that a tokenizer cuts text into."
SMALL = {
    "vocab_size": VOCAB,
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "max_position_embeddings": 256,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "pad_token_id": 0,
}


def family_configs() -> dict[str, Any]:
    """name -> a transformers config object with that family's quirks at SMALL shapes."""
    from transformers import (
        Gemma3TextConfig,
        LlamaConfig,
        MistralConfig,
        Qwen2Config,
        Qwen3Config,
    )

    return {
        # Llama with attention_bias: biases on q/k/v and o_proj.
        "llama-bias": LlamaConfig(**SMALL, attention_bias=True, tie_word_embeddings=False),
        # Llama 3.x: llama3 RoPE scaling; original_max_position_embeddings small enough that
        # head_dim 16's frequencies fall in all three bands (kept, ramped, divided).
        "llama3": LlamaConfig(
            **SMALL,
            tie_word_embeddings=True,
            rope_parameters={
                "rope_type": "llama3",
                "rope_theta": 500000.0,
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 64,
            },
        ),
        "qwen2": Qwen2Config(**SMALL, tie_word_embeddings=True),
        "qwen3": Qwen3Config(**SMALL, tie_word_embeddings=False),
        "mistral": MistralConfig(**SMALL, sliding_window=7, tie_word_embeddings=False),
        "gemma3": Gemma3TextConfig(
            **{**SMALL, "num_key_value_heads": 1, "head_dim": 32, "num_hidden_layers": 4},
            query_pre_attn_scalar=24,
            sliding_window=6,
            layer_types=[
                "sliding_attention",
                "sliding_attention",
                "full_attention",
                "sliding_attention",
            ],
            rope_parameters={
                "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e6},
                "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            },
            final_logit_softcapping=30.0,
            tie_word_embeddings=True,
        ),
    }


def randomize(model: Any, gemma: bool, seed: int) -> None:
    """Every parameter random: matrices ~ N(0, 1/fan_in), biases ~ N(0, 0.5²), norm gains
    around their identity (1, or 0 for Gemma's 1 + w), embeddings of spread 1 (0.4 when tied,
    1/4 for Gemma, which multiplies them by sqrt(hidden))."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in sorted(model.named_parameters()):
            noise = torch.randn(param.shape, generator=generator, dtype=torch.float32)
            if "norm" in name:
                param.copy_((0.0 if gemma else 1.0) + 0.2 * noise)
            elif name.endswith(".bias"):
                param.copy_(0.5 * noise)
            elif "embed_tokens" in name:
                # Tied models score with this matrix too: keep logits' spread near 3.
                tied = model.config.tie_word_embeddings
                param.copy_(noise / 4.0 if gemma else noise * (0.4 if tied else 1.0))
            else:
                param.copy_(noise / param.shape[1] ** 0.5 * (3.0 if "lm_head" in name else 1.0))


FP16_KV = "spinkv_fp16_kv"
"""An attention implementation that is transformers' SDPA with K and V rounded to fp16."""


def register_fp16_kv_attention() -> None:
    """transformers' SDPA attention with keys (after RoPE) and values rounded through fp16,
    as spinkv's cache stores them: the reference for the runtime's fp16 path."""
    from transformers import AttentionInterface, AttentionMaskInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.masking_utils import sdpa_mask

    def fp16_kv_attention(
        module: Any, query: Any, key: Any, value: Any, *args: Any, **kwargs: Any
    ) -> Any:
        return sdpa_attention_forward(
            module, query, key.half().float(), value.half().float(), *args, **kwargs
        )

    AttentionInterface.register(FP16_KV, fp16_kv_attention)
    AttentionMaskInterface.register(FP16_KV, sdpa_mask)


def reference_logits(model: Any, tokens: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """(prefill [T, vocab], decode [T, vocab]) from transformers in f32."""
    import torch
    from transformers import DynamicCache

    ids = torch.tensor([tokens])
    with torch.no_grad():
        prefill = model(ids).logits[0].float().numpy()
        cache = DynamicCache(config=model.config)
        steps = []
        for t, token in enumerate(tokens):
            out = model(
                torch.tensor([[token]]),
                past_key_values=cache,
                use_cache=True,
                cache_position=torch.tensor([t]),
            )
            steps.append(out.logits[0, -1].float().numpy())
    return prefill.astype(np.float32), np.stack(steps).astype(np.float32)


def write_family(name: str, config: Any, out: Path, seed: int) -> dict[str, Any]:
    import torch
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(
        config, dtype=torch.float32, attn_implementation="eager"
    )
    model.eval()
    randomize(model, gemma=name.startswith("gemma"), seed=seed)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=make_tokenizer(VOCAB),
        bos_token="<|im_start|>",
        eos_token="<|im_end|>",
        unk_token="<|endoftext|>",
        pad_token="<|endoftext|>",
    )
    tokenizer.chat_template = CHATML_TEMPLATE
    tokenizer.save_pretrained(out)
    tokens = tokenizer(TEXT, add_special_tokens=False)["input_ids"]
    prefill, decode = reference_logits(model, tokens)
    model.set_attn_implementation(FP16_KV)
    prefill_fp16_kv, decode_fp16_kv = reference_logits(model, tokens)
    np.savez_compressed(
        out / "reference.npz",
        tokens=np.asarray(tokens, np.int32),
        prefill=prefill,
        decode=decode,
        prefill_fp16_kv=prefill_fp16_kv,
        decode_fp16_kv=decode_fp16_kv,
    )
    for junk in ("generation_config.json", "special_tokens_map.json", "chat_template.jinja"):
        if junk == "chat_template.jinja" and (out / junk).exists():
            # Keep the template inside tokenizer_config.json, where the CLI reads it.
            config_path = out / "tokenizer_config.json"
            tok_config = json.loads(config_path.read_text())
            tok_config["chat_template"] = (out / junk).read_text()
            config_path.write_text(json.dumps(tok_config, indent=2) + "\n")
        (out / junk).unlink(missing_ok=True)
    return {
        "tokens": len(tokens),
        "prefill_vs_decode": float(np.abs(prefill - decode).max()),
        "fp16_kv_effect": float(np.abs(prefill - prefill_fp16_kv).max()),
        "logit_std": float(prefill.std()),
        "bytes": sum(f.stat().st_size for f in out.iterdir()),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    default = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "families"
    parser.add_argument("out_dir", type=Path, nargs="?", default=default)
    parser.add_argument("--only", action="append", help="write only this family (repeatable)")
    args = parser.parse_args(argv)
    register_fp16_kv_attention()
    for index, (name, config) in enumerate(family_configs().items()):
        if args.only and name not in args.only:
            continue
        facts = write_family(name, config, args.out_dir / name, SEED + index)
        print(name, json.dumps(facts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
