"""Write a tiny random Llama model in HF layout, for tests and benchmarks.

    python models/tiny.py OUT_DIR [--seed 0] [--dtype f32|f16|bf16] [--tied]

The model: 2 layers, hidden 64, 4 query heads and 2 KV heads (GQA) of head_dim 16, SwiGLU MLP
of 128, vocab 300 (a byte-level BPE trained on the text below, with ChatML special tokens),
random weights scaled so activations stay O(1) and logits are not flat. `make_tiny_model`
takes config.json overrides (e.g. ``tie_word_embeddings=True``, ``rope_scaling=...``).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a tiny test model.<|im_end|>\n' }}"
    "{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
TRAINING_TEXT = """\
The capital of France is Paris. The capital of Italy is Rome. A small model is a model with
few parameters; a tiny model is smaller still. The quick brown fox jumps over the lazy dog.
What is the capital of France? Paris is the capital of France, and it is a large city.
Tokens are the pieces that a tokenizer cuts text into: the more often a pair of pieces is
seen, the sooner the two are merged into one. There are 10 digits: 0 1 2 3 4 5 6 7 8 9.
Hello world! Hello again, world. This is a test of the tokenizer, and that is all it is.
"""

BASE_CONFIG: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "hidden_act": "silu",
    "max_position_embeddings": 512,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "rope_scaling": None,
    "vocab_size": 300,
    "tie_word_embeddings": False,
    "attention_bias": False,
    "mlp_bias": False,
    "bos_token_id": 1,
    "eos_token_id": 2,
}
TORCH_DTYPES = {"f32": "float32", "f16": "float16", "bf16": "bfloat16"}


def make_tokenizer(vocab_size: int) -> Any:
    """A byte-level BPE of vocab_size tokens (ids 0-2 are the special tokens)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(TRAINING_TEXT.splitlines(), trainer=trainer)
    return tok


def make_weights(config: dict[str, Any], seed: int) -> dict[str, np.ndarray]:
    """Random float32 weights in HF names and shapes."""
    rng = np.random.default_rng(seed)
    hidden = config["hidden_size"]
    inter = config["intermediate_size"]
    head_dim = config["head_dim"]
    q_rows = config["num_attention_heads"] * head_dim
    kv_rows = config["num_key_value_heads"] * head_dim

    def linear(rows: int, cols: int) -> np.ndarray:
        return (rng.standard_normal((rows, cols)) / np.sqrt(cols)).astype(np.float32)

    def norm(n: int) -> np.ndarray:
        return (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)

    w = {"model.embed_tokens.weight": rng.standard_normal((config["vocab_size"], hidden))}
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        w[p + "input_layernorm.weight"] = norm(hidden)
        w[p + "self_attn.q_proj.weight"] = linear(q_rows, hidden)
        w[p + "self_attn.k_proj.weight"] = linear(kv_rows, hidden)
        w[p + "self_attn.v_proj.weight"] = linear(kv_rows, hidden)
        w[p + "self_attn.o_proj.weight"] = linear(hidden, q_rows)
        w[p + "post_attention_layernorm.weight"] = norm(hidden)
        w[p + "mlp.gate_proj.weight"] = linear(inter, hidden)
        w[p + "mlp.up_proj.weight"] = linear(inter, hidden)
        w[p + "mlp.down_proj.weight"] = linear(hidden, inter)
    w["model.norm.weight"] = norm(hidden)
    if not config["tie_word_embeddings"]:
        w["lm_head.weight"] = linear(config["vocab_size"], hidden) * 4.0
    return {k: np.asarray(v, dtype=np.float32) for k, v in w.items()}


def make_tiny_model(
    out_dir: str | Path, seed: int = 0, dtype: str = "f32", **overrides: Any
) -> Path:
    """Write the tiny model into out_dir (created if needed) and return it.

    overrides replace config.json fields; weights follow the resulting shapes.
    """
    try:
        from spinkv.util.safetensors_io import save_safetensors
    except ImportError:  # a checkout without `pip install .`
        sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "cli"))
        from spinkv.util.safetensors_io import save_safetensors

    if dtype not in TORCH_DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(TORCH_DTYPES)}, not {dtype!r}")
    config = {**BASE_CONFIG, **overrides, "torch_dtype": TORCH_DTYPES[dtype]}
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)

    tokenizer = make_tokenizer(config["vocab_size"])
    if tokenizer.get_vocab_size() != config["vocab_size"]:
        raise ValueError(f"tokenizer reached only {tokenizer.get_vocab_size()} tokens")
    tokenizer.save(str(out / "tokenizer.json"))
    save_safetensors(out / "model.safetensors", make_weights(config, seed), dtype)

    files = {
        "config.json": config,
        "generation_config.json": {"bos_token_id": 1, "eos_token_id": 2},
        "tokenizer_config.json": {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "bos_token": "<|im_start|>",
            "eos_token": "<|im_end|>",
            "unk_token": "<|endoftext|>",
            "pad_token": "<|im_end|>",
            "add_bos_token": False,
            "model_max_length": config["max_position_embeddings"],
            "chat_template": CHATML_TEMPLATE,
        },
    }
    for name, content in files.items():
        (out / name).write_text(json.dumps(content, indent=2) + "\n")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dtype", choices=sorted(TORCH_DTYPES), default="f32")
    parser.add_argument("--tied", action="store_true", help="tie lm_head to the embeddings")
    args = parser.parse_args(argv)
    path = make_tiny_model(args.out_dir, args.seed, args.dtype, tie_word_embeddings=args.tied)
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
