"""`spinkv eval`: KV cache presets against the fp16 cache, on real text.

Three parts, each selectable:

- kld: teacher-forced, as decode sees it. Every compressed arm is fed the text one token at a
  time (`prefill([bos])`, then `decode(tok)`) and its logits are read after each step, so the
  logits at position t come from attention over the cache a decode step at t sees
  (compressed beyond the window). The fp16 reference uses batched prefill with all logits,
  which is equivalent for fp16 (a test checks it). Per position: KL(p_fp16 || p_arm), top-1
  agreement and next-token NLL; summaries over positions >= skip with paired bootstrap CIs.
- greedy: a fixed set of chat prompts, greedy continuations from fp16 and from each arm;
  tokens until the first divergence.
- passkey: a key hidden in a haystack of licence texts at several prompt lengths; whether each
  arm's greedy answer contains it.
"""

from __future__ import annotations

import hashlib
import os
import platform
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from spinkv.errors import InvalidInputError
from spinkv.eval import passkey
from spinkv.eval import stats as eval_stats
from spinkv.eval.arms import REFERENCE, REFERENCE_KV, KvArm
from spinkv.generation import PREFILL_BLOCK_TOKENS, chunked, common_prefix_length
from spinkv.util.progress import Steps

if TYPE_CHECKING:
    from spinkv.api import LoadedModel

SCHEMA = "spinkv.eval/1"
DEFAULT_TEXT = Path("/usr/share/common-licenses/GPL-3")
DEFAULT_TOKENS = 2048
DEFAULT_SKIP = 128
DEFAULT_GEN_TOKENS = 48
DEFAULT_BUCKET = 64
PARTS = ("kld", "greedy", "passkey")

GREEDY_PROMPTS: tuple[str, ...] = (
    "What is the capital of France?",
    "Write a Python function that checks whether a string is a palindrome.",
    "Summarise this paragraph in one sentence: The GNU General Public License is a free, "
    "copyleft license for software and other kinds of works. The licenses for most software "
    "are designed to take away your freedom to share and change the works. By contrast, the "
    "GPL is intended to guarantee your freedom to share and change all versions of a program, "
    "to make sure it remains free software for all its users.",
    "List five fruits that are red.",
    "What is 17 times 23? Show your working.",
    "Give me three tips for sleeping better.",
    "Explain what a hash table is to a beginner.",
    "Write a short poem about the sea.",
)


# ---- settings and progress ----------------------------------------------------------------


@dataclass
class EvalSettings:
    arms: list[KvArm]
    text: Path = DEFAULT_TEXT
    n_tokens: int = DEFAULT_TOKENS
    skip: int = DEFAULT_SKIP
    parts: tuple[str, ...] = PARTS
    gen_tokens: int = DEFAULT_GEN_TOKENS
    prompts: tuple[str, ...] = GREEDY_PROMPTS
    passkey_depths: tuple[int, ...] = passkey.DEFAULT_DEPTHS
    passkey_position: float = passkey.DEFAULT_POSITION
    passkey_dir: Path = passkey.LICENSE_DIR
    resamples: int = eval_stats.DEFAULT_RESAMPLES
    seed: int = eval_stats.DEFAULT_SEED
    bucket: int = DEFAULT_BUCKET

    def validate(self) -> None:
        unknown = [p for p in self.parts if p not in PARTS]
        if unknown or not self.parts:
            raise InvalidInputError(
                f"unknown eval part {', '.join(unknown) or '(none)'}: "
                f"choose from {', '.join(PARTS)}"
            )
        if self.n_tokens < 2:
            raise InvalidInputError(f"--n {self.n_tokens} must be at least 2")
        if not 0 <= self.skip < self.n_tokens - 1:
            raise InvalidInputError(f"--skip {self.skip} must be in 0..{self.n_tokens - 2}")
        if self.gen_tokens < 1:
            raise InvalidInputError(f"--gen {self.gen_tokens} must be at least 1")
        if self.bucket < 1 or self.resamples < 0:
            raise InvalidInputError("bucket must be >= 1 and resamples >= 0")

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["arms"] = [{"label": a.label, "kv": a.kv} for a in self.arms]
        for key in ("text", "passkey_dir"):
            out[key] = str(out[key])
        return out


# ---- part 1: teacher-forced KLD ------------------------------------------------------------


def text_token_ids(model: LoadedModel, path: Path, n_tokens: int) -> list[int]:
    """BOS (when the model has one) then the text's tokens, the first n_tokens of them."""
    try:
        # The first n_tokens tokens take at most this many characters.
        with path.open(encoding="utf-8") as file:
            text = file.read(model.tokenizer.max_chars_for(n_tokens))
    except UnicodeDecodeError as exc:
        raise InvalidInputError(f"{path} is not UTF-8 text") from exc
    bos = model.config.get("bos_token_id")
    ids = ([int(bos)] if bos is not None else []) + model.tokenize(text)
    return ids[:n_tokens]


def teacher_forced(
    model: LoadedModel,
    token_ids: Sequence[int],
    arms: Sequence[KvArm],
    *,
    progress: Steps | None = None,
) -> tuple[dict[str, eval_stats.PositionSeries], dict[str, dict[str, Any]]]:
    """Per-position metrics of every arm at positions 0..len-2 (each has a next token),
    and each arm's cache statistics at the end."""
    progress = progress or Steps()
    ids = [int(t) for t in token_ids]
    last = len(ids) - 1  # positions 0..last-1 have a target
    reference = model.native.session(dict(REFERENCE_KV))
    sessions = {arm.label: model.native.session(dict(arm.kv)) for arm in arms}
    series = {arm.label: eval_stats.PositionSeries() for arm in arms}
    progress.start("teacher-forced", last * (len(arms) + 1))
    for lo in range(0, last, PREFILL_BLOCK_TOKENS):
        hi = min(lo + PREFILL_BLOCK_TOKENS, last)
        ref_rows = np.asarray(reference.prefill(ids[lo:hi], True), dtype=np.float32)
        progress.advance(hi - lo)
        targets = ids[lo + 1 : hi + 1]
        for label, session in sessions.items():
            rows = np.empty_like(ref_rows)
            for i, pos in enumerate(range(lo, hi)):
                if pos == 0:
                    session.prefill([ids[0]])
                else:
                    session.decode(ids[pos])
                rows[i] = session.logits()
                progress.advance()
            series[label].extend(ref_rows, rows, targets)
    stats = {label: session.cache_stats() for label, session in sessions.items()}
    return series, stats


def summarise_arm(
    arm: KvArm,
    series: eval_stats.PositionSeries,
    cache_stats: Mapping[str, Any],
    settings: EvalSettings,
) -> dict[str, Any]:
    """The arm's figures over positions >= skip, with bootstrap CIs and a depth curve."""
    figures = eval_stats.paired_bootstrap(
        series.arrays(settings.skip), resamples=settings.resamples, seed=settings.seed
    )
    total = cache_stats.get("total", {})
    curve_kld = eval_stats.bucket_means(series.kld, series.start, settings.bucket)
    curve_top1 = eval_stats.bucket_means(
        [float(x) for x in series.top1], series.start, settings.bucket
    )
    return {
        "label": arm.label,
        "kv": arm.kv,
        **figures,
        "cache": {
            "codec": cache_stats.get("codec"),
            "bits_per_channel": total.get("bits_per_channel"),
            "compression_vs_fp16": total.get("compression_vs_fp16"),
            "compressed_tokens": total.get("compressed_tokens"),
            "fp16_tokens": total.get("fp16_tokens"),
        },
        "depth_curve": {
            "bucket": settings.bucket,
            "position": curve_kld["position"],
            "kld_mean": curve_kld["mean"],
            "top1": curve_top1["mean"],
        },
    }


def kld_token_ids(model: LoadedModel, settings: EvalSettings) -> list[int]:
    """The teacher-forced text's token ids, checked against --skip and the context."""
    ids = text_token_ids(model, settings.text, settings.n_tokens)
    if len(ids) < settings.skip + 2:
        raise InvalidInputError(
            f"{settings.text} has {len(ids)} tokens: too few for --skip {settings.skip}"
        )
    if len(ids) > model.max_context:
        raise InvalidInputError(f"--n {len(ids)} exceeds the context of {model.max_context}")
    return ids


def run_kld(
    model: LoadedModel, settings: EvalSettings, inputs: Inputs, progress: Steps
) -> dict[str, Any]:
    ids = inputs.text_ids
    series, stats = teacher_forced(model, ids, settings.arms, progress=progress)
    arms = [summarise_arm(a, series[a.label], stats[a.label], settings) for a in settings.arms]
    first = settings.arms[0].label
    return {
        "text": str(settings.text),
        "text_sha256": hashlib.sha256(settings.text.read_bytes()).hexdigest(),
        "tokens": len(ids),
        "bos": ids[0] == model.config.get("bos_token_id"),
        "positions": len(series[first]) - settings.skip,
        "skip": settings.skip,
        "reference": {"label": REFERENCE, "ppl": arms[0]["ppl_ref"]},
        "arms": arms,
    }


# ---- greedy generation (parts 2 and 3) -----------------------------------------------------


def greedy_generate(
    session: Any, prompt_ids: Sequence[int], max_tokens: int, eos_ids: Sequence[int]
) -> list[int]:
    """Greedy continuation (argmax of the logits) after a batched prefill of the prompt."""
    for chunk in chunked(list(prompt_ids), PREFILL_BLOCK_TOKENS):
        session.prefill(chunk)
    out: list[int] = []
    stop = set(eos_ids)
    while len(out) < max_tokens:
        token = int(np.argmax(session.logits()))
        out.append(token)
        if token in stop or len(out) == max_tokens:
            break
        session.decode(token)
    return out


def _eos_ids(model: LoadedModel) -> list[int]:
    return sorted(model.tokenizer.eos_token_ids)


def question_ids(model: LoadedModel) -> Callable[[str], list[int]]:
    """Token ids of a question: through the model's chat template, or as raw text for a base
    model (no template of its own: the ChatML fallback is not what it was trained on)."""
    if model.has_own_chat_template:
        return model.prompt_token_ids
    return lambda text: model.prompt_token_ids(text, raw=True)


def passkey_question_ids(model: LoadedModel) -> Callable[[str], list[int]]:
    """question_ids, with a base model's text ending in the answer's first words."""
    if model.has_own_chat_template:
        return model.prompt_token_ids
    return lambda text: model.prompt_token_ids(f"{text}\n{passkey.ANSWER_PRIMER}", raw=True)


def run_greedy(
    model: LoadedModel, settings: EvalSettings, inputs: Inputs, progress: Steps
) -> dict[str, Any]:
    eos = _eos_ids(model)
    arms = settings.arms
    progress.start("greedy", len(settings.prompts) * (len(arms) + 1))
    prompts: list[dict[str, Any]] = []
    prompt_ids = question_ids(model)
    for prompt in settings.prompts:
        ids = prompt_ids(prompt)
        ref = greedy_generate(
            model.native.session(dict(REFERENCE_KV)), ids, settings.gen_tokens, eos
        )
        progress.advance()
        record: dict[str, Any] = {
            "prompt": prompt,
            "prompt_tokens": len(ids),
            "reference": {"tokens": len(ref), "text": model.detokenize(ref)},
            "arms": {},
        }
        for arm in arms:
            out = greedy_generate(model.native.session(dict(arm.kv)), ids, settings.gen_tokens, eos)
            progress.advance()
            record["arms"][arm.label] = {
                "agree_tokens": common_prefix_length(ref, out),
                "identical": out == ref,
                "tokens": len(out),
                "text": model.detokenize(out),
            }
        prompts.append(record)
    summary = []
    for arm in arms:
        agree = [p["arms"][arm.label]["agree_tokens"] for p in prompts]
        summary.append(
            {
                "label": arm.label,
                "mean_agree_tokens": float(np.mean(agree)),
                "min_agree_tokens": int(min(agree)),
                "identical": sum(p["arms"][arm.label]["identical"] for p in prompts),
                "prompts": len(prompts),
            }
        )
    return {"gen_tokens": settings.gen_tokens, "arms": summary, "prompts": prompts}


def passkey_prompts(
    model: LoadedModel, settings: EvalSettings
) -> tuple[list[passkey.PasskeyPrompt], list[int]]:
    """The passkey prompts at every depth that fits the context, and the depths that don't."""
    limit = model.max_context - passkey.ANSWER_TOKENS
    skipped = [d for d in settings.passkey_depths if d > limit]
    if skipped and len(skipped) == len(settings.passkey_depths):
        raise InvalidInputError(
            f"every --passkey-depths depth ({', '.join(map(str, skipped))}) is beyond the "
            f"context of {model.max_context} tokens: nothing would be measured"
        )
    hay_ids = model.tokenize(passkey.haystack_text(settings.passkey_dir))
    prompts = [
        passkey.build_prompt(
            depth,
            passkey.pass_key(depth, settings.seed),
            haystack_ids=hay_ids,
            detokenize=lambda ids: model.detokenize(ids, skip_special_tokens=False),
            prompt_ids=passkey_question_ids(model),
            position=settings.passkey_position,
        )
        for depth in settings.passkey_depths
        if depth <= limit
    ]
    return prompts, skipped


def run_passkey(
    model: LoadedModel, settings: EvalSettings, inputs: Inputs, progress: Steps
) -> dict[str, Any]:
    eos = _eos_ids(model)
    arms = [a for a in settings.arms if a.label != REFERENCE]  # fp16 runs once, as reference
    labels = [REFERENCE, *(a.label for a in arms)]
    kvs = [dict(REFERENCE_KV), *(dict(a.kv) for a in arms)]
    progress.start("passkey", len(inputs.passkey_prompts) * len(labels))
    rows: list[dict[str, Any]] = []
    for prompt in inputs.passkey_prompts:
        key = prompt.key
        row: dict[str, Any] = {
            "depth": prompt.depth,
            "prompt_tokens": len(prompt.token_ids),
            "key": key,
            "results": {},
        }
        for label, kv in zip(labels, kvs):
            started = time.perf_counter()
            out = greedy_generate(
                model.native.session(kv), prompt.token_ids, passkey.ANSWER_TOKENS, eos
            )
            answer = model.detokenize(out)
            row["results"][label] = {
                "found": passkey.found(key, answer),
                "answer": answer,
                "seconds": round(time.perf_counter() - started, 2),
            }
            progress.advance()
        rows.append(row)
    return {
        "position": settings.passkey_position,
        "answer_tokens": passkey.ANSWER_TOKENS,
        "labels": labels,
        "skipped_depths": inputs.skipped_depths,
        "depths": rows,
    }


# ---- the whole evaluation ------------------------------------------------------------------


@dataclass
class Inputs:
    """Token ids prepared (and checked) before any long part starts."""

    text_ids: list[int] = field(default_factory=list)
    passkey_prompts: list[passkey.PasskeyPrompt] = field(default_factory=list)
    skipped_depths: list[int] = field(default_factory=list)


def prepare(model: LoadedModel, settings: EvalSettings) -> Inputs:
    inputs = Inputs()
    if "kld" in settings.parts:
        inputs.text_ids = kld_token_ids(model, settings)
    if "passkey" in settings.parts:
        inputs.passkey_prompts, inputs.skipped_depths = passkey_prompts(model, settings)
    return inputs


Runner = Callable[["LoadedModel", EvalSettings, Inputs, Steps], dict[str, Any]]
RUNNERS: dict[str, Runner] = {
    "kld": run_kld,
    "greedy": run_greedy,
    "passkey": run_passkey,
}


def machine_info() -> dict[str, Any]:
    from spinkv import _native
    from spinkv.util.system import cpu_info

    return {
        "cpu": cpu_info()[0],
        "cores": os.cpu_count(),
        "machine": platform.machine(),
        "system": platform.system(),
        "python": platform.python_version(),
        "isa": _native.isa(),
        "threads": _native.threads(),
    }


@dataclass
class EvalRun:
    """The record being built; `record()` is what --json prints."""

    settings: EvalSettings
    model: dict[str, Any]
    results: dict[str, Any] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)

    def record(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "model": self.model,
            "machine": machine_info(),
            "settings": self.settings.to_dict(),
            **{part: self.results.get(part) for part in PARTS},
            "seconds": self.seconds,
        }


def evaluate(
    model: LoadedModel, settings: EvalSettings, progress: Steps | None = None
) -> dict[str, Any]:
    """Run the selected parts and return the full record (see SCHEMA)."""
    settings.validate()
    progress = progress or Steps()
    info = model.info
    run = EvalRun(
        settings,
        {k: info.get(k) for k in ("name", "path", "n_params", "dtype", "n_layers", "max_context")},
    )
    inputs = prepare(model, settings)
    for part in PARTS:
        if part in settings.parts:
            started = time.perf_counter()
            run.results[part] = RUNNERS[part](model, settings, inputs, progress)
            run.seconds[part] = round(time.perf_counter() - started, 2)
    return run.record()
