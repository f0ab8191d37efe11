"""How often replies run to max tokens in a repetition loop, per sampling setting.

Runs a fixed set of ordinary chat prompts through the default model with each sampling
setting (the old default, greedy without repetition penalty, against the chat default the
CLI now uses), with fixed seeds, untouched outputs, no retries, and counts replies that hit
max tokens while repeating themselves (a loop: the reply's last 40% is mostly word 4-grams
already seen earlier in it).

    python benches/sampling_loops.py [--max-tokens 256] [--seeds 3] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import spinkv
from spinkv.sampling import CHAT_DEFAULTS, SamplingParams

PROMPTS = [
    "Who wrote the novel 1984?",
    "Write a Python function that checks whether a number is prime.",
    "Hi! How are you today?",
    "What is the capital of Australia?",
    "Explain photosynthesis in simple terms.",
    "Give me three tips for sleeping better.",
    "What is the difference between a list and a tuple in Python?",
    "Tell me a short story about a cat who learns to fly.",
    "How do I make a cup of tea?",
    "What causes the seasons on Earth?",
    "Summarize the plot of Romeo and Juliet.",
    "Write a haiku about autumn.",
    "What is 17 times 23?",
    "Why is the sky blue?",
    "Recommend a good book for a long flight.",
    "How does a bicycle stay upright?",
    "What are the main ingredients of pizza?",
    "Can you explain what a black hole is?",
    "Write a limerick about a programmer.",
    "What should I pack for a weekend camping trip?",
]


def is_loop(text: str) -> bool:
    """The last 40% of the reply is mostly word 4-grams it already used earlier."""
    words = text.split()
    if len(words) < 20:
        return False
    grams = [tuple(words[i : i + 4]) for i in range(len(words) - 3)]
    cut = int(len(grams) * 0.6)
    seen = set(grams[:cut])
    tail = grams[cut:]
    repeated = sum(1 for g in tail if g in seen)
    return repeated >= 0.5 * len(tail)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--seeds", type=int, default=3, help="seeds per prompt for sampling arms")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)

    model = spinkv.load()
    arms = {
        "greedy, no penalty (old default)": [SamplingParams()],
        "chat default (new)": [
            SamplingParams(**{**CHAT_DEFAULTS.to_dict(), "seed": seed})
            for seed in range(args.seeds)
        ],
    }
    record: dict[str, dict[str, float | int]] = {}
    started = time.perf_counter()
    for arm, settings in arms.items():
        replies = hit_max = loops = 0
        for prompt in PROMPTS:
            for sampling in settings:
                result = model.generate(prompt, max_tokens=args.max_tokens, sampling=sampling)
                replies += 1
                if result.finish_reason == "length":
                    hit_max += 1
                    loops += is_loop(result.text)
        record[arm] = {
            "replies": replies,
            "hit_max_tokens": hit_max,
            "hit_max_tokens_in_loop": loops,
            "loop_rate": loops / replies,
        }
        print(
            f"{arm}: {loops}/{replies} replies ran to max tokens in a loop "
            f"({100 * loops / replies:.0f} %), {hit_max} hit max tokens",
            file=sys.stderr,
        )
    print(f"{time.perf_counter() - started:.0f} s", file=sys.stderr)
    if args.json:
        print(json.dumps({"max_tokens": args.max_tokens, "arms": record}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
