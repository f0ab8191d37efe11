"""`spinkv eval --suite TIER --merge A.json,B.json`: one record from suite runs made apart
(parts side by side, families or corpus texts run apart, or arms added later). Records must
share the preregistration, tier, seed and model; a part measured by several records must be
the same measurement (same texts or prompts, identical fp16 replies) and each arm appears once
per part. The decision is
made again over the merged record; an arm missing a part cannot SHIP.

Records of llama.cpp's KV caches on the same corpus (`python -m spinkv.eval.llamacpp_ref`) are
kept apart as reference rows (`references`): shown in the tables and on the Pareto plot, never
decided on (they are another runtime, not an arm of ours)."""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

from spinkv.errors import InvalidInputError
from spinkv.eval import corpus
from spinkv.eval import suite as suite_mod
from spinkv.eval.arms import KvArm
from spinkv.eval.families import FAMILIES
from spinkv.eval.llamacpp_ref import SCHEMA as REFERENCE_SCHEMA


def _same(a: Mapping[str, Any], b: Mapping[str, Any], keys: Sequence[str]) -> bool:
    return all(a.get(k) == b.get(k) for k in keys)


def _merge_corpus(into: dict[str, Any], other: Mapping[str, Any], bucket: int) -> None:
    """Records of other texts (--texts) add their rows and the pooled figures are made again
    from every row; records of the same texts add arms."""
    if not _same(into, other, ("tokens", "skip")):
        raise InvalidInputError("--merge: the corpus parts were measured on different texts")
    mine_names = [t["name"] for t in into["texts"]]
    their_names = [t["name"] for t in other["texts"]]
    if not set(mine_names) & set(their_names):
        rows = [*into["texts"], *other["texts"]]
        if {a for t in into["texts"] for a in t["arms"]} != {
            a for t in other["texts"] for a in t["arms"]
        }:
            raise InvalidInputError("--merge: corpus parts of other texts ran other arms")
        if any("pool" not in f for t in rows for f in t["arms"].values()):
            raise InvalidInputError(
                "--merge: a corpus part of some texts lacks the per-text pooling figures "
                "(made before --texts existed); run its texts again"
            )
        order = {t.name: i for i, t in enumerate(corpus.TEXTS)}
        into["texts"] = sorted(
            [*into["texts"], *copy.deepcopy(other["texts"])], key=lambda t: order[t["name"]]
        )
        into["held_out"] = [t["name"] for t in into["texts"] if t["held_out"]]
        labels = list(dict.fromkeys(a for t in into["texts"] for a in t["arms"]))
        into["pooled"] = (
            {label: suite_mod.pool_from_rows(into["texts"], label, bucket) for label in labels}
            if into["held_out"]
            else {}
        )
        return
    if mine_names != their_names or into.get("held_out") != other.get("held_out"):
        raise InvalidInputError("--merge: the corpus parts were measured on different texts")
    for mine, theirs in zip(into["texts"], other["texts"]):
        _add_arms(mine["arms"], theirs["arms"], "corpus")
    _add_arms(into["pooled"], other["pooled"], "corpus")


def _families(part: Mapping[str, Any]) -> set[str]:
    return {p["family"] for p in part["prompts"]}


def _merge_tasks(into: dict[str, Any], other: Mapping[str, Any]) -> None:
    """Records of other families add their prompts; records of the same prompts add arms."""
    keys = ("family", "index", "prompt_tokens", "fp16")
    if into["decodings"] != other["decodings"]:
        raise InvalidInputError("--merge: the task parts ran different decodings")
    if not _families(into) & _families(other):
        if {a for p in into["prompts"] for a in p["arms"]} != {
            a for p in other["prompts"] for a in p["arms"]
        }:
            raise InvalidInputError("--merge: task parts of other families ran other arms")
        into["prompts"] = sorted(
            [*into["prompts"], *copy.deepcopy(other["prompts"])],
            key=lambda p: (FAMILIES.index(p["family"]), p["index"]),
        )
        return
    if len(into["prompts"]) != len(other["prompts"]):
        raise InvalidInputError("--merge: the task parts ran different prompts")
    for mine, theirs in zip(into["prompts"], other["prompts"]):
        if not _same(mine, theirs, keys):
            raise InvalidInputError(
                f"--merge: {mine['family']} prompt {mine['index']} differs between the records "
                "(prompt or fp16 replies)"
            )
        _add_arms(mine["arms"], theirs["arms"], "tasks")


def _add_arms(into: dict[str, Any], other: Mapping[str, Any], part: str) -> None:
    for label, value in other.items():
        if label in into:
            raise InvalidInputError(f"--merge: arm {label} has the {part} part twice")
        into[label] = value


def merge_records(
    records: Sequence[Mapping[str, Any]], settings: suite_mod.SuiteSettings
) -> dict[str, Any]:
    pre = suite_mod.load_prereg(settings)
    references = [r for r in records if r.get("schema") == REFERENCE_SCHEMA]
    records = [r for r in records if r.get("schema") != REFERENCE_SCHEMA]
    if not records:
        raise InvalidInputError("--merge needs suite records")
    first = records[0]
    merged: dict[str, Any] = {**first, "arms": [], "corpus": None, "tasks": None, "seconds": {}}
    for n, record in enumerate(records):
        if record.get("schema") != suite_mod.SCHEMA:
            raise InvalidInputError(f"--merge: record {n + 1} is not a {suite_mod.SCHEMA} record")
        if record["preregistration"]["sha256"] != pre.sha256:
            raise InvalidInputError(
                f"--merge: record {n + 1} was made under another preregistration than {pre.path}"
            )
        for key in ("tier", "seed"):
            if record.get(key) != first.get(key):
                raise InvalidInputError(f"--merge: the records differ in {key}")
        if record["model"].get("path") != first["model"].get("path"):
            raise InvalidInputError("--merge: the records come from different models")
        for arm in record["arms"]:
            if arm not in merged["arms"]:
                merged["arms"].append(arm)
        for part in ("corpus", "tasks"):
            if not record.get(part):
                continue
            if merged[part] is None:
                merged[part] = copy.deepcopy(record[part])
            elif part == "corpus":
                _merge_corpus(merged[part], record[part], int(first["tier"]["depth_bucket"]))
            else:
                _merge_tasks(merged[part], record[part])
        for part, seconds in record.get("seconds", {}).items():
            merged["seconds"][part] = round(merged["seconds"].get(part, 0.0) + seconds, 1)
    merged["references"] = [*first.get("references", [])]
    for ref in references:
        merged["references"] += reference_rows(ref, merged)
    arms = [KvArm(a["label"], a["kv"]) for a in merged["arms"]]
    merged["summary"] = suite_mod.summarise(merged, pre, arms, int(first["seed"]))
    return merged


def reference_rows(ref: Mapping[str, Any], merged: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One row per KV type of a llama.cpp reference record, checked to be on the merged
    record's corpus (same tier, tokens, first skipped positions and texts)."""
    corpus_part = merged.get("corpus")
    if ref.get("tier") != merged["tier"]["name"]:
        raise InvalidInputError("--merge: the llama.cpp reference rows are from another tier")
    if corpus_part and (
        (ref.get("tokens"), ref.get("skip")) != (corpus_part["tokens"], corpus_part["skip"])
        or [t["name"] for t in ref["texts"]] != [t["name"] for t in corpus_part["texts"]]
    ):
        raise InvalidInputError("--merge: the llama.cpp reference rows are on another corpus")
    rows = []
    for kv, pooled in ref["pooled"].items():
        rows.append(
            {
                "label": f"llama.cpp {kv}",
                "engine": ref.get("engine"),
                "pooled": pooled,
                "texts": {t["name"]: t["arms"][kv] for t in ref["texts"]},
            }
        )
    return rows
