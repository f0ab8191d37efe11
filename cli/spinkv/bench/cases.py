"""`spinkv bench`: llama-bench-like prefill and decode speed at several context depths.

One *case* is (engine, ISA, KV arm, depth d, prompt p, generation n). For each (engine, ISA,
KV arm, depth): a fresh session is filled with d tokens of real text (licence texts), in
prefill calls of 512 tokens, timed once ("fill": the anchor's "prefill at depth d" figure),
and its state marked. Then, for each (p, n) and each repetition:

1. decode n tokens greedily from depth d: the first one timed alone ("first decode"), the
   rest as "steady decode" (tg); decode tok/s over all n is the anchor's decode figure;
   then back to the mark;
2. prefill the next p tokens of the text in one call, prompt processing at depth d (pp, as
   llama-bench's `pp512 @ d2048`); then back to the mark.

Going back restores the cache exactly (our session checkpoint; llama.cpp drops the cache
entries past d), so every repetition starts from the same state as a fresh fill would give.
Wall-clock times give the rates; the runtime's own timers give the phase breakdown.
"""

from __future__ import annotations

import itertools
import math
import statistics
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from spinkv.errors import InvalidInputError
from spinkv.eval.arms import KvArm
from spinkv.generation import common_prefix_length
from spinkv.kv.options import DEFAULT_KV_PRESET
from spinkv.util.progress import Steps
from spinkv.util.system import peak_rss_bytes, peak_rss_reset

LICENCE_DIR = Path("/usr/share/common-licenses")
LICENCES = ("GPL-3", "MPL-2.0", "Apache-2.0")
FILL_CHUNK = 512
"""Tokens per prefill call while filling to depth (llama.cpp's n_batch in the anchors)."""
WARMUP_PROMPT, WARMUP_GEN = 32, 4
TIMER_KEYS = ("attention_ms", "matmul_ms", "other_ms", "sample_ms")
SIZE_METRICS = ("peak_rss_bytes", "kv_payload_bytes", "kv_allocated_bytes", "scratch_bytes")
RATE_METRICS = (
    "pp_tok_s",
    "first_decode_ms",
    "tg_tok_s",
    "decode_tok_s",
    "tg_attention_ms",
    "tg_matmul_ms",
    "tg_other_ms",
    "tg_sample_ms",
    "pp_attention_ms",
    "pp_matmul_ms",
    "pp_other_ms",
    "codec_ms",
    "codec_pct",
)
"""Per-repetition figures summarised as mean, std and median (*_ms are per token)."""
KV_PHASES = (
    "query_transform",
    "key_scan",
    "softmax",
    "value_scan",
    "value_finish",
    "append_encode",
    "page_alloc",
)
"""The KV cache's phase timers (spinkv_kv::PhaseTimes), reported per decode token."""


class Engine(Protocol):
    """What the measurement loop drives: ours or llama.cpp."""

    name: str

    def new_context(self, kv: Mapping[str, Any] | None) -> None: ...

    def prefill(self, tokens: list[int]) -> None: ...

    def greedy_next(self) -> int: ...

    def decode(self, token: int) -> None: ...

    def mark(self) -> None:
        """Remember the current state; restore() returns to it (any number of times)."""

    def restore(self) -> None: ...

    def timings(self) -> Mapping[str, float] | None: ...

    def reset_timings(self) -> None: ...

    def cache_stats(self) -> Mapping[str, Any] | None: ...


# ---- settings -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    isa: str
    arm: KvArm
    depth: int
    n_prompt: int
    n_gen: int

    @property
    def max_tokens(self) -> int:
        return self.depth + max(self.n_prompt, self.n_gen)


@dataclass(frozen=True)
class BenchSettings:
    n_prompt: tuple[int, ...] = (512,)
    n_gen: tuple[int, ...] = (128,)
    depths: tuple[int, ...] = (0,)
    reps: int = 5
    isas: tuple[str, ...] = ()
    arms: tuple[KvArm, ...] = (KvArm(DEFAULT_KV_PRESET, {"preset": DEFAULT_KV_PRESET}),)

    def validate(self) -> None:
        if self.reps < 1:
            raise InvalidInputError(f"-r must be at least 1, got {self.reps}")
        if not self.isas or not self.arms:
            raise InvalidInputError("nothing to run: no ISA or no KV arm")
        if not any(p > 0 or n > 0 for p, n in itertools.product(self.n_prompt, self.n_gen)):
            raise InvalidInputError("nothing to time: -p and -n are both 0")

    def cases(self) -> list[Case]:
        """Every combination, in run order: depth outermost (a side-by-side engine fills its
        context once per depth and takes turns with ours: Companions), then ISA, KV, p, n.
        p = n = 0 is dropped."""
        return [
            Case(isa, arm, d, p, n)
            for d, isa, arm, p, n in itertools.product(
                self.depths, self.isas, self.arms, self.n_prompt, self.n_gen
            )
            if p > 0 or n > 0
        ]

    def row_order(self, row: Mapping[str, Any]) -> tuple:
        """Sort key for result rows: our rows by ISA, KV, depth, p, n; llama.cpp's last."""
        labels = [arm.label for arm in self.arms]
        return (
            row["engine"] != "spinkv",
            self.isas.index(row["isa"]) if row["isa"] in self.isas else 0,
            labels.index(row["kv"]) if row["kv"] in labels else 0,
            self.depths.index(row["depth"]),
            row["n_prompt"],
            row["n_gen"],
        )


def parse_int_list(value: str, flag: str, *, minimum: int = 0) -> tuple[int, ...]:
    """ "512,2048" -> (512, 2048); each value >= minimum, duplicates dropped, order kept."""
    items: list[int] = []
    for part in value.split(","):
        part = part.strip()
        if not part:
            continue
        try:
            number = int(part)
        except ValueError:
            raise InvalidInputError(
                f"{flag} takes comma-separated integers, got {value!r}"
            ) from None
        if number < minimum:
            raise InvalidInputError(f"{flag} values must be >= {minimum}, got {number}")
        if number not in items:
            items.append(number)
    if not items:
        raise InvalidInputError(f"{flag} needs at least one value")
    return tuple(items)


def parse_name_list(value: str, flag: str) -> tuple[str, ...]:
    names = tuple(dict.fromkeys(p.strip().lower() for p in value.split(",") if p.strip()))
    if not names:
        raise InvalidInputError(f"{flag} needs at least one value")
    return names


# ---- text -----------------------------------------------------------------------------------


def licence_text(root: Path = LICENCE_DIR) -> str:
    texts = [(root / name).read_text() for name in LICENCES if (root / name).is_file()]
    if not texts:
        raise InvalidInputError(f"no licence texts under {root} to benchmark on")
    return "".join(texts)


def text_tokens(encode: Any, n: int, bos: int | None, text: str | None = None) -> list[int]:
    """n tokens of real text: BOS (if any), then the licence texts, repeated as needed."""
    ids = list(encode(text if text is not None else licence_text()))
    if not ids:
        raise InvalidInputError("the benchmark text tokenizes to nothing")
    tokens = [bos] if bos is not None else []
    while len(tokens) < n:
        tokens += ids
    return tokens[:n]


# ---- one repetition -------------------------------------------------------------------------


@dataclass
class RepSample:
    """One repetition's figures (None where the case has no such phase)."""

    values: dict[str, float | None] = field(default_factory=dict)
    generated: list[int] = field(default_factory=list)
    """The greedy tokens decoded (to check that two engines agree)."""


def _timer_delta(before: Mapping[str, float] | None, after: Mapping[str, float] | None) -> dict:
    if before is None or after is None:
        return {}
    return {k: float(after.get(k, 0.0)) - float(before.get(k, 0.0)) for k in TIMER_KEYS}


def _compressed(stats: Mapping[str, Any] | None) -> int:
    if not stats:
        return 0
    return int(stats.get("total", {}).get("compressed_tokens", 0))


def codec_excess_ms(attention: Sequence[float], sealed: Sequence[bool], near: int = 6) -> float:
    """Attention time of the steps that sealed (encoded) a page, above the median of the
    nearest steps that did not: an estimate of append-time encoding cost."""
    plain = [i for i, s in enumerate(sealed) if not s]
    if not plain:
        return 0.0
    total = 0.0
    for i, was_sealed in enumerate(sealed):
        if was_sealed:
            nearest = sorted(plain, key=lambda j: abs(j - i))[:near]
            total += attention[i] - statistics.median(attention[j] for j in nearest)
    return max(total, 0.0)


def _per_token(delta: Mapping[str, float], tokens: int, prefix: str) -> dict[str, float]:
    keys = TIMER_KEYS if prefix == "tg" else TIMER_KEYS[:3]
    return {f"{prefix}_{k}": delta[k] / tokens for k in keys if k in delta}


def fill_context(engine: Engine, arm: KvArm, tokens: Sequence[int]) -> float:
    """A fresh context holding tokens, marked; returns the fill's wall time in seconds. The
    RSS high-water mark restarts once the previous context is gone."""
    engine.new_context(arm.kv)
    peak_rss_reset()
    started = time.perf_counter()
    for start in range(0, len(tokens), FILL_CHUNK):
        engine.prefill(list(tokens[start : start + FILL_CHUNK]))
    elapsed = time.perf_counter() - started
    engine.mark()
    return elapsed


def measure_rep(engine: Engine, case: Case, tokens: Sequence[int], bos: int | None) -> RepSample:
    """One repetition of case on an engine filled with tokens[:depth] and marked; it is
    back at the mark on return. tokens holds >= depth + n_prompt text tokens."""
    values: dict[str, float | None] = {}
    generated: list[int] = []
    d = case.depth
    stats = None
    if case.n_gen:
        values.update(_measure_decode(engine, case, d > 0, bos, generated))
        stats = engine.cache_stats()
        engine.restore()
    if case.n_prompt:
        prompt = list(tokens[d : d + case.n_prompt])
        engine.reset_timings()
        before = engine.timings()
        started = time.perf_counter()
        engine.prefill(prompt)
        values["pp_tok_s"] = len(prompt) / (time.perf_counter() - started)
        values.update(_per_token(_timer_delta(before, engine.timings()), len(prompt), "pp"))
        stats = stats or engine.cache_stats()
        engine.restore()
    values["peak_rss_bytes"] = float(peak_rss_bytes())
    if stats:
        total = stats.get("total", {})
        payload = sum(int(total.get(k, 0)) for k in ("k_payload_bytes", "v_payload_bytes"))
        values["kv_payload_bytes"] = float(payload + int(total.get("norm_bytes", 0)))
        values["kv_allocated_bytes"] = float(total.get("allocated_bytes", 0))
        values["scratch_bytes"] = float(stats.get("scratch_bytes", 0))
    return RepSample(values, generated)


def _measure_decode(
    engine: Engine, case: Case, filled: bool, bos: int | None, generated: list[int]
) -> dict[str, float | None]:
    token = engine.greedy_next() if filled else (bos if bos is not None else 0)
    engine.reset_timings()
    started = time.perf_counter()
    engine.decode(token)
    token = engine.greedy_next()
    first_s = time.perf_counter() - started
    generated.append(token)
    values: dict[str, float | None] = {"first_decode_ms": first_s * 1000.0}
    steady = case.n_gen - 1
    if steady == 0:
        values["decode_tok_s"] = 1.0 / first_s
        return values
    start_timers = engine.timings()
    prev_timers, prev_sealed = start_timers, _compressed(engine.cache_stats())
    attention: list[float] = []
    sealed: list[bool] = []
    wall = 0.0
    for _ in range(steady):
        started = time.perf_counter()
        engine.decode(token)
        token = engine.greedy_next()
        wall += time.perf_counter() - started
        generated.append(token)
        timers = engine.timings()
        if timers is not None and prev_timers is not None:
            attention.append(timers["attention_ms"] - prev_timers["attention_ms"])
            now_sealed = _compressed(engine.cache_stats())
            sealed.append(now_sealed > prev_sealed)
            prev_timers, prev_sealed = timers, now_sealed
    values["tg_tok_s"] = steady / wall
    values["decode_tok_s"] = case.n_gen / (wall + first_s)
    values.update(_per_token(_timer_delta(start_timers, engine.timings()), steady, "tg"))
    if any(sealed):
        codec = codec_excess_ms(attention, sealed) / steady
        values["codec_ms"] = codec
        values["codec_pct"] = 100.0 * codec / (wall * 1000.0 / steady)
    return values


def profile_kv_phases(
    engine: Engine, case: Case, filled: bool, bos: int | None
) -> dict[str, float]:
    """One more decode pass of n_gen tokens, untimed, with the KV cache's phase timers on:
    `kv_<phase>_ms` per token. Empty for engines without them (llama.cpp). The engine is
    back at its mark on return."""
    set_profiling = getattr(engine, "set_kv_profiling", None)
    if set_profiling is None or not case.n_gen:
        return {}
    token = engine.greedy_next() if filled else (bos if bos is not None else 0)
    set_profiling(True)
    try:
        for _ in range(case.n_gen):
            engine.decode(token)
            token = engine.greedy_next()
        times = engine.kv_phase_times() or {}  # type: ignore[attr-defined]
    finally:
        set_profiling(False)
        engine.restore()
    values = {
        f"kv_{phase}_ms": float(times[f"{phase}_ms"]) / case.n_gen
        for phase in KV_PHASES
        if f"{phase}_ms" in times
    }
    skipped = times.get("value_blocks_skipped_pct")
    if skipped is not None:  # compressed value blocks that sparse values left out
        values["kv_value_skipped_pct"] = float(skipped)
    return values


# ---- aggregation ----------------------------------------------------------------------------


def summarize(values: Iterable[float | None]) -> tuple[float, float, float] | None:
    """(mean, sample std, median) of the values present; None if there are none."""
    present = [v for v in values if v is not None and not math.isnan(v)]
    if not present:
        return None
    std = statistics.stdev(present) if len(present) > 1 else 0.0
    return statistics.fmean(present), std, statistics.median(present)


def case_row(engine: str, case: Case, samples: Sequence[RepSample]) -> dict[str, Any]:
    """A flat result row: metric = mean, metric_std, metric_median; sizes are maxima."""
    row: dict[str, Any] = {
        "engine": engine,
        "isa": case.isa,
        "kv": case.arm.label,
        "depth": case.depth,
        "n_prompt": case.n_prompt,
        "n_gen": case.n_gen,
        "reps": len(samples),
        "fill_tok_s": None,
        "fill_tok_s_std": None,
        "fill_tok_s_median": None,
    }
    for metric in RATE_METRICS:
        summary = summarize(s.values.get(metric) for s in samples)
        mean, std, median = summary if summary else (None, None, None)
        row[metric], row[f"{metric}_std"], row[f"{metric}_median"] = mean, std, median
    for metric in SIZE_METRICS:
        present = [s.values[metric] for s in samples if s.values.get(metric) is not None]
        row[metric] = int(max(present)) if present else None
    row["greedy_tokens"] = samples[0].generated if samples else []
    return row


def run_cases(
    engine: Engine,
    cases: Sequence[Case],
    reps: int,
    tokens: Sequence[int],
    bos: int | None,
    progress: Steps,
    *,
    select_isa: Any = None,
    after_rep: Callable[[Case], None] | None = None,
) -> Iterator[dict[str, Any]]:
    """Yield one row per case. Consecutive cases with the same (ISA, KV arm, depth) share one
    fill. select_isa(name) is called when the ISA changes; then an untimed short run warms
    caches, page tables and thread pools. after_rep(case), if given, runs after each
    repetition (another engine's turn: see Companions)."""
    current: str | None = None
    for (isa, arm, depth), group in itertools.groupby(cases, lambda c: (c.isa, c.arm, c.depth)):
        if isa != current:
            if select_isa is not None:
                select_isa(isa)
            warm_up(engine, isa, arm, tokens, bos)
            current = isa
        fill_s = fill_context(engine, arm, tokens[:depth])
        for case in group:
            samples = []
            for _ in range(reps):
                samples.append(measure_rep(engine, case, tokens, bos))
                progress.advance()
                if after_rep is not None:
                    after_rep(case)
            yield filled_row(engine, case, samples, fill_s, bos)


def warm_up(engine: Engine, isa: str, arm: KvArm, tokens: Sequence[int], bos: int | None) -> None:
    """An untimed short run on an empty context: caches, page tables and thread pools."""
    fill_context(engine, arm, ())
    measure_rep(engine, Case(isa, arm, 0, WARMUP_PROMPT, WARMUP_GEN), tokens, bos)


def filled_row(
    engine: Engine, case: Case, samples: Sequence[RepSample], fill_s: float, bos: int | None
) -> dict[str, Any]:
    """case_row with the KV phases of a profiled pass and the fill rate (tok/s) of the
    context the samples were measured on."""
    row = case_row(engine.name, case, samples)
    row.update(profile_kv_phases(engine, case, case.depth > 0, bos))
    fill = case.depth / fill_s if case.depth and fill_s > 0 else None
    row["fill_tok_s"] = row["fill_tok_s_median"] = fill
    row["fill_tok_s_std"] = None
    return row


class Companions:
    """Engines measured beside ours (llama.cpp's configurations), one repetition of a case's
    twin (same depth, prompt and generation) after each of our repetitions, so the engines
    take turns — ours, theirs, ours, theirs — and a noisy neighbour weighs on both alike.
    Each companion keeps its own context at the current depth: filled once per depth, it
    serves our every KV arm and ISA, so a companion's row pools that many more samples."""

    def __init__(
        self,
        lanes: Sequence[tuple[Engine, Mapping[int, Sequence[Case]]]],
        tokens: Sequence[int],
        bos: int | None,
        progress: Steps,
    ) -> None:
        self._lanes = lanes
        self._tokens, self._bos, self._progress = tokens, bos, progress
        self._fills: list[float] = []
        self._twins: list[dict[tuple[int, int], Case]] = []
        self._samples: list[dict[tuple[int, int], list[RepSample]]] = []

    def fill(self, depth: int) -> None:
        """Warm up each companion and fill its context to depth; forget earlier samples."""
        self._fills, self._twins, self._samples = [], [], []
        for engine, by_depth in self._lanes:
            twins = {(c.n_prompt, c.n_gen): c for c in by_depth.get(depth, ())}
            fill_s = 0.0
            if twins:
                first = next(iter(twins.values()))
                warm_up(engine, first.isa, first.arm, self._tokens, self._bos)
                fill_s = fill_context(engine, first.arm, self._tokens[:depth])
            self._fills.append(fill_s)
            self._twins.append(twins)
            self._samples.append({})

    def after(self, case: Case) -> None:
        """One repetition of case's twin on every companion that has one."""
        for (engine, _), twins, samples in zip(self._lanes, self._twins, self._samples):
            key = (case.n_prompt, case.n_gen)
            if key in twins:
                rep = measure_rep(engine, twins[key], self._tokens, self._bos)
                samples.setdefault(key, []).append(rep)
                self._progress.advance()

    def rows(self) -> Iterator[dict[str, Any]]:
        """One row per twin measured since the last fill."""
        lanes = zip(self._lanes, self._twins, self._samples, self._fills)
        for (engine, _), twins, samples, fill_s in lanes:
            for key, reps in samples.items():
                yield filled_row(engine, twins[key], reps, fill_s, self._bos)


ANCHOR_KV = "f16"
"""llama.cpp's anchor configurations are those with this KV cache type (any flash attention)."""


def ratios(rows: Sequence[Mapping[str, Any]], reference: str = "llama.cpp") -> list[dict]:
    """ours / reference (ratios of medians) for each of our rows with reference rows at the
    same depth, p, n: for each metric the best of the reference's anchor configurations
    (llama.cpp's f16 KV with flash attention off or on: the faster per depth), named in
    `<metric>_reference`."""
    refs: dict[tuple[int, int, int], list[Mapping[str, Any]]] = {}
    for r in rows:
        if r["engine"] == reference and str(r["kv"]).split(" ")[0] == ANCHOR_KV:
            refs.setdefault((r["depth"], r["n_prompt"], r["n_gen"]), []).append(r)
    out = []
    for row in rows:
        candidates = refs.get((row["depth"], row["n_prompt"], row["n_gen"]))
        if row["engine"] == reference or not candidates:
            continue
        entry: dict[str, Any] = {
            "isa": row["isa"],
            "kv": row["kv"],
            "depth": row["depth"],
            "n_prompt": row["n_prompt"],
            "n_gen": row["n_gen"],
        }
        for metric in ("fill_tok_s", "pp_tok_s", "tg_tok_s", "decode_tok_s"):
            # medians: one preempted repetition must not swing the ratio
            key = f"{metric}_median"
            best = max(candidates, key=lambda r: r.get(key) or 0.0)
            ours, theirs = row.get(key), best.get(key)
            entry[f"{metric}_ratio"] = ours / theirs if ours and theirs else None
            entry[f"{metric}_reference"] = best["kv"] if theirs else None
        ref = candidates[0]
        entry["same_greedy_tokens"] = common_prefix_length(
            row.get("greedy_tokens") or (), ref.get("greedy_tokens") or ()
        )
        entry["greedy_tokens"] = len(ref.get("greedy_tokens") or ())
        out.append(entry)
    return out


# ---- our engine -----------------------------------------------------------------------------


class SpinkvEngine:
    """Engine over a `spinkv._native.Model`: one session per repetition, greedy sampling."""

    name = "spinkv"

    def __init__(self, native_model: Any) -> None:
        from spinkv import _native

        self._model = native_model
        self._sampler = _native.Sampler()
        self._session: Any = None

    @property
    def session(self) -> Any:
        if self._session is None:
            raise RuntimeError("new_context() first")
        return self._session

    def new_context(self, kv: Mapping[str, Any] | None) -> None:
        self._session = None  # free the previous cache before allocating the next
        self._session = self._model.session(kv=dict(kv) if kv else None)

    def prefill(self, tokens: list[int]) -> None:
        self.session.prefill(tokens)

    def greedy_next(self) -> int:
        return int(self.session.sample(self._sampler))

    def decode(self, token: int) -> None:
        self.session.decode(token)

    def mark(self) -> None:
        self.session.checkpoint()

    def restore(self) -> None:
        # rollback_turn() consumes the checkpoint: take it again for the next repetition
        if not self.session.rollback_turn():
            raise RuntimeError("no checkpoint to go back to")
        self.session.checkpoint()

    def timings(self) -> Mapping[str, float]:
        return self.session.timings()

    def reset_timings(self) -> None:
        self.session.reset_timings()

    def cache_stats(self) -> Mapping[str, Any]:
        return self.session.cache_stats()

    def set_kv_profiling(self, on: bool) -> None:
        self.session.set_kv_profiling(on)

    def kv_phase_times(self) -> Mapping[str, float] | None:
        return self.session.kv_phase_times()
