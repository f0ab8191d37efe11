"""What 8-bit (Q8_0) weights cost in quality: teacher-forced logits of a model with q8_0
weights against the same model with f16 weights (both with the fp16 KV cache) on real texts.

    python benches/weights_quality.py [--model smollm2] [--tokens 1024] [TEXT ...]

Prints, per text, the mean KL divergence KL(f16 || q8_0) over positions, top-1 agreement and
both perplexities. The q8_0 model is `spinkv models pull MODEL --dtype q8_0` (imported on
first use). Default texts: licences, Python source and a table every Debian machine has.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import spinkv
from spinkv.models.store import pull

DEFAULT_TEXTS = (
    "/usr/share/common-licenses/GPL-3",
    "/usr/share/common-licenses/Apache-2.0",
    "/usr/lib/python3.11/argparse.py",
    "/etc/services",
)


def log_softmax(logits: np.ndarray) -> np.ndarray:
    shifted = logits.astype(np.float64) - logits.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--tokens", type=int, default=1024)
    parser.add_argument("texts", nargs="*", default=list(DEFAULT_TEXTS))
    args = parser.parse_args()
    reference = spinkv.load(pull(args.model))
    quantized = spinkv.load(pull(args.model, dtype="q8_0"))
    for text in args.texts:
        path = Path(text)
        if not path.is_file():
            print(f"{text}: missing, skipped", file=sys.stderr)
            continue
        ids = reference.tokenize(path.read_text(errors="replace"))[: args.tokens]
        a = log_softmax(reference.logits(ids, kv="fp16"))
        b = log_softmax(quantized.logits(ids, kv="fp16"))
        kld = float((np.exp(a) * (a - b)).sum(axis=-1).mean())
        top1 = float((a.argmax(-1) == b.argmax(-1)).mean())
        positions = np.arange(len(ids) - 1)
        ppl_a = float(np.exp(-a[positions, ids[1:]].mean()))
        ppl_b = float(np.exp(-b[positions, ids[1:]].mean()))
        print(
            f"{text}: {len(ids)} tokens, KLD {kld:.5f}, top-1 {100 * top1:.1f}%, "
            f"perplexity f16 {ppl_a:.3f} q8_0 {ppl_b:.3f} ({100 * (ppl_b / ppl_a - 1):+.2f}%)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
