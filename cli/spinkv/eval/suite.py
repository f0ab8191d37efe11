"""`spinkv eval --suite TIER`: the design study's model-level evaluation, preregistered.

Two parts:

- corpus: teacher-forced KLD / top-1 / perplexity against the fp16 cache on every corpus
  text (corpus.TEXTS), as decode sees it (runner.teacher_forced), per text with paired
  bootstrap CIs over positions, pooled over the held-out texts with CIs over texts, and a
  depth curve.
- tasks: the task families (families.py), each prompt decoded greedily and with each
  preregistered seed by fp16 and by every arm from the same prefilled state (paired.py),
  scored per prompt (scoring.py) and summarised per family (verdict.py).

Then, per arm, the preregistered rules (preregistration.toml): budgets, permutation tests,
Holm over the ship family, SHIP / NO-SHIP.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from spinkv.errors import InvalidInputError
from spinkv.eval import corpus, families, scoring, verdict
from spinkv.eval import prereg as prereg_mod
from spinkv.eval import runner as ev
from spinkv.eval import stats as eval_stats
from spinkv.eval.arms import REFERENCE, REFERENCE_KV, KvArm
from spinkv.eval.paired import Decoding, decodings, run_prompt
from spinkv.util.progress import Steps

if TYPE_CHECKING:
    from spinkv.api import LoadedModel

SCHEMA = "spinkv.eval.suite/1"
MODEL_KEYS = ("name", "path", "n_params", "dtype", "max_context")
PARTS = ("corpus", "tasks")
TASK_METRICS = ("agreement", "first_divergence", "chrf")
EXACT_METRICS = ("exact_match", "answer_agreement")
CORPUS_METRICS = ("kld_mean", "top1", "ppl_delta_pct")


def known_metrics() -> list[str]:
    names = [f"corpus.{m}" for m in CORPUS_METRICS]
    for family in families.FAMILIES:
        names += [f"{family}.{m}" for m in TASK_METRICS]
        if family in families.EXACT_FAMILIES:
            names += [f"{family}.{m}" for m in EXACT_METRICS]
    return [*names, "boundary.finish_agreement"]


@dataclass
class SuiteSettings:
    arms: list[KvArm]
    tier: str = "quick"
    prereg_path: Path | None = None
    parts: tuple[str, ...] = PARTS
    corpus_tokens: int | None = None
    """Overrides the tier's corpus_tokens (--tokens)."""
    seed: int | None = None
    """Overrides the preregistered bootstrap/permutation seed (--bootstrap-seed)."""
    families: tuple[str, ...] = families.FAMILIES
    """The task families to run (--families); the decision needs all of them."""
    texts: tuple[str, ...] | None = None
    """The corpus texts to run (--texts; default the tier's); merge the others' records."""

    def validate(self) -> None:
        unknown = [p for p in self.parts if p not in PARTS]
        if unknown or not self.parts:
            raise InvalidInputError(
                f"unknown suite part {', '.join(unknown) or '(none)'}: choose from "
                f"{', '.join(PARTS)}"
            )
        if not self.arms:
            raise InvalidInputError("the suite needs at least one KV arm besides fp16")
        unknown_families = [f for f in self.families if f not in families.FAMILIES]
        if unknown_families or not self.families:
            raise InvalidInputError(
                f"unknown task family {', '.join(unknown_families) or '(none)'}: choose from "
                f"{', '.join(families.FAMILIES)}"
            )
        unknown_texts = [t for t in self.texts or () if t not in corpus.BY_NAME]
        if unknown_texts or self.texts == ():
            raise InvalidInputError(
                f"unknown corpus text {', '.join(unknown_texts) or '(none)'}: choose from "
                f"{', '.join(corpus.BY_NAME)}"
            )
        if self.corpus_tokens is not None and self.corpus_tokens < 2:
            raise InvalidInputError(f"--tokens {self.corpus_tokens} must be at least 2")


def load_prereg(settings: SuiteSettings) -> prereg_mod.Preregistration:
    pre = prereg_mod.load(settings.prereg_path)
    unknown = verdict.check_budgets_known(pre, known_metrics())
    if unknown:
        raise InvalidInputError(
            f"preregistration {pre.path}: budgets for metrics the suite does not compute: "
            f"{', '.join(unknown)}"
        )
    pre.tier(settings.tier)
    return pre


# ---- corpus ----------------------------------------------------------------------------


def corpus_texts(
    tier: prereg_mod.Tier, only: Sequence[str] | None = None
) -> tuple[corpus.CorpusText, ...]:
    """The tier's texts: all, or the first corpus_texts of them (always one held out); with
    `only`, those of them named there (a part of the corpus, merged with the rest later)."""
    texts = corpus.TEXTS if tier.corpus_texts == 0 else corpus.TEXTS[: max(tier.corpus_texts, 2)]
    if only is None:
        return texts
    outside = [name for name in only if name not in {t.name for t in texts}]
    if outside:
        raise InvalidInputError(
            f"--texts {','.join(outside)}: not in the {tier.name} tier's corpus "
            f"({', '.join(t.name for t in texts)})"
        )
    return tuple(t for t in texts if t.name in only)


def _text_ids(model: LoadedModel, entry: corpus.CorpusText, n_tokens: int) -> list[int]:
    bos = model.config.get("bos_token_id")
    ids = ([int(bos)] if bos is not None else []) + model.tokenize(corpus.load_text(entry))
    return ids[: min(n_tokens, model.max_context)]


def _bits_beyond_window(stats: Mapping[str, Any]) -> float | None:
    """All-in bits per channel of the compressed pages (headers and norms included), from a
    cache_stats() dict: the rate beyond the fp16 window and sinks."""
    total = stats.get("total", {})
    tokens, compressed = total.get("tokens", 0), total.get("compressed_tokens", 0)
    bpc, allocated = total.get("bits_per_channel", 0.0), total.get("allocated_bytes", 0)
    if not compressed or not bpc or not allocated:
        return None
    channels_per_token = allocated * 8.0 / (bpc * tokens)
    return (allocated - total.get("window_bytes", 0)) * 8.0 / (compressed * channels_per_token)


def run_corpus(
    model: LoadedModel,
    pre: prereg_mod.Preregistration,
    tier: prereg_mod.Tier,
    arms: Sequence[KvArm],
    n_tokens: int,
    seed: int,
    progress: Steps,
    only: Sequence[str] | None = None,
) -> dict[str, Any]:
    texts = corpus_texts(tier, only)
    skip = min(tier.corpus_skip, n_tokens - 2)
    per_text: list[dict[str, Any]] = []
    series_by_arm: dict[str, list[eval_stats.PositionSeries]] = {a.label: [] for a in arms}
    held: list[bool] = []
    stats_last: dict[str, Any] = {}
    for entry in texts:
        ids = _text_ids(model, entry, n_tokens)
        if len(ids) < skip + 2:
            raise InvalidInputError(f"corpus text {entry.name} has too few tokens ({len(ids)})")
        series, stats_last = ev.teacher_forced(model, ids, arms, progress=progress)
        row: dict[str, Any] = {
            "name": entry.name,
            "kind": entry.kind,
            "path": str(entry.path),
            "sha256": entry.sha256,
            "held_out": entry.held_out,
            "tokens": len(ids),
            "positions": len(ids) - 1 - skip,
            "arms": {},
        }
        for arm in arms:
            arrays = series[arm.label].arrays(skip)
            figures: dict[str, Any] = dict(
                eval_stats.paired_bootstrap(
                    arrays, resamples=pre.bootstrap_resamples, seed=seed, confidence=pre.confidence
                )
            )
            figures["nll_delta"] = float(np.mean(arrays["nll_arm"] - arrays["nll_ref"]))
            # what pooling needs when texts are run apart and merged (pool_from_rows)
            s = series[arm.label]
            total = stats_last.get(arm.label, {}).get("total", {})
            figures["pool"] = {
                "positions": int(len(arrays["kld"])),
                "depth": eval_stats.bucket_means(s.kld, s.start, tier.depth_bucket),
                "bits_all_in": total.get("bits_per_channel"),
                "bits_beyond_window": _bits_beyond_window(stats_last.get(arm.label, {})),
            }
            row["arms"][arm.label] = figures
            series_by_arm[arm.label].append(series[arm.label])
        held.append(entry.held_out)
        per_text.append(row)
    pooled: dict[str, Any] = {}
    for arm in arms:
        if any(held):
            pooled[arm.label] = _pool(arm, series_by_arm[arm.label], held, skip, tier, stats_last)
    return {
        "tokens": n_tokens,
        "skip": skip,
        "texts": per_text,
        "held_out": [t["name"] for t in per_text if t["held_out"]],
        "pooled": pooled,
    }


def _pool(
    arm: KvArm,
    series: Sequence[eval_stats.PositionSeries],
    held: Sequence[bool],
    skip: int,
    tier: prereg_mod.Tier,
    stats: Mapping[str, Any],
) -> dict[str, Any]:
    """Pooled held-out figures (positions of every held-out text together), per-text units
    for the tests, the depth curve and the cache's bits per channel."""
    arrays = [s.arrays(skip) for s, h in zip(series, held) if h]
    kld = np.concatenate([a["kld"] for a in arrays])
    top1 = np.concatenate([a["top1"] for a in arrays]).astype(np.float64)
    nll_delta = np.concatenate([a["nll_arm"] - a["nll_ref"] for a in arrays])
    depth = [
        eval_stats.bucket_means(s.kld, s.start, tier.depth_bucket)
        for s, h in zip(series, held)
        if h
    ]
    n_buckets = min(len(d["mean"]) for d in depth)
    total = stats.get(arm.label, {}).get("total", {})
    return {
        "kld_mean": float(kld.mean()),
        "top1": float(top1.mean()),
        "ppl_delta_pct": float((np.exp(nll_delta.mean()) - 1.0) * 100.0),
        "units": {
            "kld_mean": [float(a["kld"].mean()) for a in arrays],
            "top1": [float(a["top1"].mean()) for a in arrays],
            "ppl_delta_pct": [
                float((np.exp((a["nll_arm"] - a["nll_ref"]).mean()) - 1.0) * 100.0) for a in arrays
            ],
        },
        "depth_curve": {
            "bucket": tier.depth_bucket,
            "position": depth[0]["position"][:n_buckets],
            "kld_mean": [float(np.mean([d["mean"][i] for d in depth])) for i in range(n_buckets)],
        },
        "bits_all_in": total.get("bits_per_channel"),
        "bits_beyond_window": _bits_beyond_window(stats.get(arm.label, {})),
    }


def pool_from_rows(rows: Sequence[Mapping[str, Any]], label: str, bucket: int) -> dict[str, Any]:
    """The pooled held-out figures of one arm from per-text rows (texts run apart and merged):
    the same quantities as _pool, each text weighted by its number of positions."""
    held = [r["arms"][label] for r in rows if r["held_out"]]
    if not held:
        raise InvalidInputError("--merge: the merged corpus has no held-out text")
    n = np.array([f["pool"]["positions"] for f in held], dtype=np.float64)
    kld = np.array([f["kld_mean"]["value"] for f in held])
    top1 = np.array([f["top1"]["value"] for f in held])
    nll = np.array([f["nll_delta"] for f in held])
    depth = [f["pool"]["depth"] for f in held]
    n_buckets = min(len(d["mean"]) for d in depth)
    last = rows[-1]["arms"][label]["pool"]
    return {
        "kld_mean": float((n * kld).sum() / n.sum()),
        "top1": float((n * top1).sum() / n.sum()),
        "ppl_delta_pct": float((np.exp((n * nll).sum() / n.sum()) - 1.0) * 100.0),
        "units": {
            "kld_mean": [float(k) for k in kld],
            "top1": [float(t) for t in top1],
            "ppl_delta_pct": [float((np.exp(d) - 1.0) * 100.0) for d in nll],
        },
        "depth_curve": {
            "bucket": bucket,
            "position": depth[0]["position"][:n_buckets],
            "kld_mean": [float(np.mean([d["mean"][i] for d in depth])) for i in range(n_buckets)],
        },
        "bits_all_in": last["bits_all_in"],
        "bits_beyond_window": last["bits_beyond_window"],
    }


def corpus_units(pooled: Mapping[str, Any]) -> list[verdict.Units]:
    refs = {"kld_mean": 0.0, "top1": 1.0, "ppl_delta_pct": 0.0}
    out = []
    for metric in CORPUS_METRICS:
        arm = pooled["units"][metric]
        out.append(
            verdict.Units(
                f"corpus.{metric}",
                arm,
                [refs[metric]] * len(arm),
                pooled=pooled[metric],
                unit="text",
            )
        )
    return out


# ---- tasks -----------------------------------------------------------------------------


def build_prompts(
    model: LoadedModel,
    pre: prereg_mod.Preregistration,
    tier: prereg_mod.Tier,
    seed: int,
    only: Sequence[str] = families.FAMILIES,
) -> list[families.TaskPrompt]:
    builder = families.Builder(
        prompt_ids=lambda messages: model.prompt_token_ids(messages),  # type: ignore[arg-type]
        max_context=model.max_context,
        count=tier.prompts_per_family,
        open_tokens=tier.open_tokens,
        answer_tokens=tier.answer_tokens,
        seed=seed,
    )
    return families.build_all(
        builder,
        tokenize=model.tokenize,
        detokenize=lambda ids: model.detokenize(ids, skip_special_tokens=False),
        families=[f for f in families.FAMILIES if f in only],
    )


def _score_prompt(
    prompt: families.TaskPrompt,
    ref: Mapping[str, Any],
    replies: Mapping[str, Any],
    decs: Sequence[Decoding],
) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for dec in decs:
        r, a = ref[dec.name], replies[dec.name]
        row = {**a.to_dict(), **scoring.compare(r.tokens, a.tokens, r.text, a.text)}
        row["finish_same"] = a.finish == r.finish and len(a.tokens) == len(r.tokens)
        if prompt.answer is not None:
            row["correct"] = families.is_correct(prompt, a.text)
            row["answer_agrees"] = families.extracted_answer(
                prompt, a.text
            ) == families.extracted_answer(prompt, r.text)
        out[dec.name] = row
    return out


def run_tasks(
    model: LoadedModel,
    pre: prereg_mod.Preregistration,
    tier: prereg_mod.Tier,
    arms: Sequence[KvArm],
    prompts: Sequence[families.TaskPrompt],
    progress: Steps,
) -> dict[str, Any]:
    decs = decodings(pre, tier)
    progress.start("suite prompts", len(prompts) * (len(arms) + 1))
    records = []
    for prompt in prompts:
        ref = run_prompt(model, prompt, dict(REFERENCE_KV), decs)
        progress.advance()
        record: dict[str, Any] = {
            **prompt.to_dict(),
            "fp16": {name: reply.to_dict() for name, reply in ref.items()},
            "arms": {},
        }
        sampled = [ref[d.name].text for d in decs if d.sampled]
        record["reseed_floor"] = scoring.reseed_floor(sampled)
        if prompt.answer is not None:
            record["fp16_correct"] = {
                d.name: families.is_correct(prompt, ref[d.name].text) for d in decs
            }
        for arm in arms:
            replies = run_prompt(model, prompt, arm.kv, decs)
            record["arms"][arm.label] = _score_prompt(prompt, ref, replies, decs)
            progress.advance()
        records.append(record)
    return {"decodings": [d.name for d in decs], "prompts": records}


def task_units(tasks: Mapping[str, Any], label: str) -> list[verdict.Units]:
    """Per family and metric: one unit per prompt (the mean over its decodings)."""
    decs = tasks["decodings"]
    out: list[verdict.Units] = []
    for family in families.FAMILIES:
        rows = [p for p in tasks["prompts"] if p["family"] == family]
        if not rows:
            continue

        def per_prompt(key: str, rows: list[dict[str, Any]] = rows) -> list[float]:
            return [float(np.mean([p["arms"][label][d][key] for d in decs])) for p in rows]

        floors = [p["reseed_floor"] for p in rows]
        lengths = [float(np.mean([p["fp16"][d]["tokens"] for d in decs])) for p in rows]
        ones = [1.0] * len(rows)
        out.append(verdict.Units(f"{family}.agreement", per_prompt("agreement"), ones))
        out.append(verdict.Units(f"{family}.first_divergence", per_prompt("agree_tokens"), lengths))
        out.append(verdict.Units(f"{family}.chrf", per_prompt("chrf"), [100.0] * len(rows), floors))
        if family in families.EXACT_FAMILIES:
            fp16_em = [float(np.mean([p["fp16_correct"][d] for d in decs])) for p in rows]
            out.append(verdict.Units(f"{family}.exact_match", per_prompt("correct"), fp16_em))
            out.append(
                verdict.Units(f"{family}.answer_agreement", per_prompt("answer_agrees"), ones)
            )
        if family == "boundary":
            out.append(verdict.Units("boundary.finish_agreement", per_prompt("finish_same"), ones))
    return out


# ---- the whole suite -------------------------------------------------------------------


def summarise(
    record: Mapping[str, Any], pre: prereg_mod.Preregistration, arms: Sequence[KvArm], seed: int
) -> dict[str, Any]:
    """Per arm: every metric's figures and the decision."""
    out: dict[str, Any] = {}
    for arm in arms:
        units: list[verdict.Units] = []
        corpus_part, tasks_part = record.get("corpus"), record.get("tasks")
        if corpus_part and arm.label in corpus_part["pooled"]:
            units += corpus_units(corpus_part["pooled"][arm.label])
        if tasks_part and tasks_part["prompts"] and arm.label in tasks_part["prompts"][0]["arms"]:
            units += task_units(tasks_part, arm.label)
        metrics = {
            u.metric: verdict.evaluate(u, pre.budgets.get(u.metric), pre, seed) for u in units
        }
        out[arm.label] = {"metrics": metrics, **verdict.decide(metrics, pre)}
    return out


def evaluate_suite(
    model: LoadedModel, settings: SuiteSettings, progress: Steps | None = None
) -> dict[str, Any]:
    """Run the suite and return its record (see SCHEMA)."""
    settings.validate()
    progress = progress or Steps()
    pre = load_prereg(settings)
    tier = pre.tier(settings.tier)
    seed = pre.seed if settings.seed is None else settings.seed
    arms = [a for a in settings.arms if a.label != REFERENCE] or list(settings.arms)
    if "tasks" in settings.parts:
        scoring.require_sacrebleu()
    n_tokens = settings.corpus_tokens or tier.corpus_tokens
    texts = corpus_texts(tier, settings.texts) if "corpus" in settings.parts else ()
    needed = tuple(t.name for t in texts)
    if "tasks" in settings.parts:
        needed += families.SOURCE_TEXTS
    corpus.check_all(tuple(dict.fromkeys(needed)))
    prompts = (
        build_prompts(model, pre, tier, seed, settings.families)
        if "tasks" in settings.parts
        else []
    )
    record: dict[str, Any] = {
        "schema": SCHEMA,
        "model": {k: model.info.get(k) for k in MODEL_KEYS},
        "machine": ev.machine_info(),
        "preregistration": pre.to_dict(),
        "tier": {"name": tier.name, **{k: v for k, v in vars(tier).items() if k != "name"}},
        "arms": [{"label": a.label, "kv": a.kv} for a in arms],
        "seed": seed,
        "corpus": None,
        "tasks": None,
        "seconds": {},
    }
    if "corpus" in settings.parts:
        started = time.perf_counter()
        record["corpus"] = run_corpus(
            model, pre, tier, arms, n_tokens, seed, progress, settings.texts
        )
        record["seconds"]["corpus"] = round(time.perf_counter() - started, 1)
    if "tasks" in settings.parts:
        started = time.perf_counter()
        record["tasks"] = run_tasks(model, pre, tier, arms, prompts, progress)
        record["seconds"]["tasks"] = round(time.perf_counter() - started, 1)
    record["summary"] = summarise(record, pre, arms, seed)
    return record
