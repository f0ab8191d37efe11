"""From per-unit figures to the preregistered decision: each metric's interval, its paired
permutation test against fp16, its budget (the stop rule), Holm over the ship family, and
SHIP / NO-SHIP per arm."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from spinkv.eval import hypothesis as hyp
from spinkv.eval.prereg import Preregistration, Rule


@dataclass
class Units:
    """One metric of one arm: a value per unit (prompt or text) and fp16's value for the
    same unit. floor: per-unit reseed floors (reseed_bar rules); pooled: the pooled point
    estimate when it is not the mean of the units (corpus figures)."""

    metric: str
    arm: list[float]
    ref: list[float]
    floor: list[float] | None = None
    pooled: float | None = None
    unit: str = "prompt"
    extra: dict[str, Any] = field(default_factory=dict)


def excess(units: Units, rule: Rule) -> np.ndarray:
    """How far each unit clears the rule's bar (>= 0: within budget)."""
    arm = np.asarray(units.arm, dtype=np.float64)
    ref = np.asarray(units.ref, dtype=np.float64)
    if rule.kind == "reseed_bar":
        if units.floor is None:
            raise ValueError(f"{units.metric}: a reseed_bar rule needs reseed floors")
        floor = np.asarray(units.floor, dtype=np.float64)
        return arm - (floor + rule.value * (100.0 - floor))
    if rule.kind == "min_delta":
        return (arm - ref) - rule.value
    if rule.kind == "min":
        return arm - rule.value
    return rule.value - arm


def within_budget(units: Units, rule: Rule, ex: np.ndarray) -> bool:
    """The stop rule on the point estimate: pooled figures against absolute bounds, else
    the mean excess."""
    if units.pooled is not None and rule.kind in ("min", "max"):
        return units.pooled >= rule.value if rule.kind == "min" else units.pooled <= rule.value
    return float(ex.mean()) >= -1e-12


def evaluate(units: Units, rule: Rule | None, prereg: Preregistration, seed: int) -> dict[str, Any]:
    """The metric's figures: arm and fp16 means, delta with its bootstrap CI, the two-sided
    permutation p of the delta and, with a budget, the non-inferiority p and the stop rule."""
    conf, boots, perms = prereg.confidence, prereg.bootstrap_resamples, prereg.permutation_resamples
    arm = hyp.interval(units.arm, boots, seed, conf)
    delta_units = [a - r for a, r in zip(units.arm, units.ref)]
    delta = hyp.interval(delta_units, boots, seed, conf)
    out: dict[str, Any] = {
        "metric": units.metric,
        "unit": units.unit,
        "n": len(units.arm),
        "arm": arm.to_dict(),
        "fp16": float(np.mean(units.ref)),
        "delta": delta.to_dict(),
        "p_difference": hyp.sign_flip_p(delta_units, resamples=perms, seed=seed),
        **units.extra,
    }
    if units.pooled is not None:
        out["pooled"] = units.pooled
    if units.floor is not None:
        out["reseed_floor"] = float(np.mean(units.floor))
    if rule is not None:
        ex = excess(units, rule)
        out["budget"] = {"rule": rule.kind, "value": rule.value, "describe": rule.describe()}
        if rule.kind == "reseed_bar":
            out["bar"] = float(np.mean(units.arm) - ex.mean())
        out["excess"] = hyp.interval(ex.tolist(), boots, seed, conf).to_dict()
        out["within_budget"] = within_budget(units, rule, ex)
        out["p_noninferior"] = hyp.sign_flip_p(
            ex.tolist(), alternative="greater", resamples=perms, seed=seed
        )
    return out


def decide(metrics: Mapping[str, Mapping[str, Any]], prereg: Preregistration) -> dict[str, Any]:
    """SHIP when every Holm-family metric rejects its non-inferiority null at the corrected
    level and no budgeted metric is outside its budget; INCOMPLETE when a budgeted metric was
    not measured (e.g. --only tasks); NO-SHIP otherwise, with the reasons."""
    family = list(prereg.holm_family)
    present = [m for m in family if m in metrics]
    adjusted = hyp.holm([metrics[m]["p_noninferior"] for m in present]) if present else []
    holm_rows = []
    reasons: list[str] = []
    for name, adj in zip(present, adjusted):
        rejected = adj <= prereg.alpha
        holm_rows.append(
            {
                "metric": name,
                "p": metrics[name]["p_noninferior"],
                "p_holm": adj,
                "rejected": rejected,
            }
        )
        if not rejected:
            reasons.append(f"{name}: non-inferiority not shown (Holm p {adj:.3g})")
    for name, row in metrics.items():
        if "within_budget" in row and not row["within_budget"]:
            reasons.append(f"{name}: outside its budget ({row['budget']['describe']})")
    missing = [m for m in prereg.budgets if m not in metrics]  # the stop rule needs them all
    if reasons:
        verdict = "NO-SHIP"
    elif missing:
        verdict = "INCOMPLETE"
        reasons = [f"not measured: {', '.join(missing)}"]
    else:
        verdict = "SHIP"
    return {"verdict": verdict, "alpha": prereg.alpha, "holm": holm_rows, "reasons": reasons}


def check_budgets_known(prereg: Preregistration, known: Sequence[str]) -> list[str]:
    """Budget names the suite does not compute (a typo in the preregistration)."""
    return [m for m in prereg.budgets if m not in known]
