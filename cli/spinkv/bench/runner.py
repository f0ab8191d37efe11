"""Putting a `spinkv bench` run together: checks made before anything loads, our engine and
(optionally) llama.cpp depth by depth, and the record the report prints."""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from spinkv.bench import cases as bm
from spinkv.bench.cross import CASE_NOTES, native_kernel_cases, run_cross_kernels
from spinkv.bench.kernels import DEFAULT_DEPTHS, KERNEL_NOTES, NOT_MEASURED, run_kernels
from spinkv.bench.report import BENCH_NOTES
from spinkv.errors import InvalidInputError
from spinkv.util.progress import Steps

LLAMA_ISA = "native"


def check_isas(names: Sequence[str]) -> tuple[str, ...]:
    """The ISAs to run, each checked with set_isa (the CPU has it, this build has kernels
    for it); the ISA in use is left unchanged. Empty -> the one in use now."""
    from spinkv import _native

    original = _native.isa()
    if not names:
        return (original,)
    try:
        for name in names:
            try:
                _native.set_isa(name)
            except _native.SpinkvError as exc:
                raise InvalidInputError(f"--isa {name}: {exc}") from None
    finally:
        _native.set_isa(original)
    return tuple(names)


@contextmanager
def keep_isa() -> Iterator[None]:
    """Restore the ISA in use when the block exits."""
    from spinkv import _native

    original = _native.isa()
    try:
        yield
    finally:
        _native.set_isa(original)


def check_context(cases: Sequence[bm.Case], max_context: int) -> None:
    for case in cases:
        if case.max_tokens > max_context:
            raise InvalidInputError(
                f"depth {case.depth} + {max(case.n_prompt, case.n_gen)} tokens is more than "
                f"the model's context of {max_context}"
            )


def _llama_cases(cases: Sequence[bm.Case], label: str) -> dict[int, list[bm.Case]]:
    """One llama.cpp case per distinct (depth, p, n) for the configuration `label`, grouped
    by depth."""
    by_depth: dict[int, list[bm.Case]] = {}
    arm = bm.KvArm(label, {})
    for case in cases:
        twin = bm.Case(LLAMA_ISA, arm, case.depth, case.n_prompt, case.n_gen)
        group = by_depth.setdefault(case.depth, [])
        if twin not in group:
            group.append(twin)
    return by_depth


def run_benchmark(
    loaded: Any,
    settings: bm.BenchSettings,
    progress: Steps,
    *,
    command: str,
    compare_llama_cpp: bool = False,
    llama_kv: Sequence[str] = (),
    on_row: Callable[[Mapping[str, Any], Mapping[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Run every case (and llama.cpp's twins in each configuration of llama_kv's cache
    types, one repetition of each after each of ours: `bm.Companions`) and return the
    record: system header, settings, rows, ratios, notes. on_row(row, system) is called as
    each row completes (to stream results of long runs)."""
    from spinkv import _native
    from spinkv.bench.report import memory_bound, system_info

    cases = settings.cases()
    check_context(cases, int(loaded.config["max_context"]))
    system = system_info(loaded, isas=settings.isas, command=command)
    system["memory"] = memory_bound(loaded.config)
    engine = bm.SpinkvEngine(loaded.native)
    llamas: list[tuple[Any, dict[int, list[bm.Case]]]] = []
    notes = [BENCH_NOTES]
    if compare_llama_cpp:
        from spinkv.bench import llamacpp

        module = llamacpp.require_llama_cpp()
        configs = llamacpp.configs_for(llama_kv or llamacpp.DEFAULT_KV_TYPES)
        progress.start("converting the model to a GGUF for llama.cpp", 1)
        path = llamacpp.gguf_for(loaded.path)
        progress.advance()
        system["llama_cpp"] = llamacpp.describe(module, configs, path)
        n_ctx = max(case.max_tokens for case in cases)
        for config in configs:
            engine_args = {"n_ctx": n_ctx, "threads": _native.threads(), "config": config}
            try:
                llama = llamacpp.LlamaCppEngine(path, **engine_args)
            except ValueError as exc:  # e.g. a quantized cache on heads it cannot block
                notes.append(f"llama.cpp {config.label}: not run ({exc})")
                continue
            llamas.append((llama, _llama_cases(cases, config.label)))
    # Each of our repetitions is followed by one of its twin in every llama.cpp configuration.
    n_runs = len(cases) * (1 + len(llamas))
    tokens = bm.text_tokens(
        loaded.tokenizer.encode,
        max(case.max_tokens for case in cases),
        loaded.tokenizer.bos_token_id,
    )
    bos = loaded.tokenizer.bos_token_id
    rows: list[dict[str, Any]] = []
    common = (settings.reps, tokens, bos, progress)
    companions = bm.Companions(llamas, tokens, bos, progress)
    progress.start("bench", n_runs * settings.reps)
    try:
        with keep_isa():
            for depth in settings.depths:
                ours = [case for case in cases if case.depth == depth]
                companions.fill(depth)
                runs = bm.run_cases(
                    engine, ours, *common, select_isa=_native.set_isa, after_rep=companions.after
                )
                for row in itertools.chain(runs, companions.rows()):
                    rows.append(row)
                    if on_row is not None:
                        on_row(row, system)
    finally:
        for llama, _ in llamas:
            llama.close()
    rows.sort(key=settings.row_order)
    system["load_average_end"] = [round(x, 2) for x in os.getloadavg()]
    return {
        "system": system,
        "settings": _settings_record(settings),
        "rows": rows,
        "ratios": bm.ratios(rows) if llamas else [],
        "notes": notes,
    }


def run_kernel_benchmark(
    loaded: Any,
    settings: bm.BenchSettings,
    progress: Steps,
    *,
    command: str,
    depths_given: bool,
    cross_isas: Sequence[str] = (),
) -> dict[str, Any]:
    """Kernel mode: the probe-model rows for the ISAs this process runs, plus the cross-built
    kernel benchmark (`bench_cross`) for NEON / SIMD128 when asked for."""
    from spinkv import _native
    from spinkv.bench.report import system_info

    steps = max(max(settings.n_gen), 64)
    depths = tuple(d for d in settings.depths if d > 0) if depths_given else DEFAULT_DEPTHS
    if not depths_given:  # the defaults that fit this model's context
        depths = tuple(d for d in depths if d + steps <= loaded.max_context)
    if not depths:
        raise InvalidInputError("--kernels needs a depth > 0 (-d)")
    # The probe model is sized from the depths: the real model's context bounds them, as it
    # bounds the depths of a normal run (a depth of 10^8 would prefill for hours).
    for depth in depths:
        if depth + steps > loaded.max_context:
            raise InvalidInputError(
                f"depth {depth} + {steps} steps is more than the model's context of "
                f"{loaded.max_context}"
            )
    system = system_info(loaded, isas=settings.isas, command=command)
    progress.start("kernels", len(settings.isas) * len(settings.arms) * len(depths) * settings.reps)
    with keep_isa():
        rows = run_kernels(
            loaded.config, settings.isas, settings.arms, depths, steps, settings.reps, progress
        )
    system["load_average_end"] = [round(x, 2) for x in os.getloadavg()]
    known = set(_native.cpu_features())
    cases = native_kernel_cases(settings.isas)
    cases += run_cross_kernels(cross_isas) if cross_isas else []
    skipped = [
        note
        for isa, note in NOT_MEASURED.items()
        if isa not in settings.isas and isa not in cross_isas
    ]
    if "avx512" in known and "avx512" not in settings.isas:
        skipped.append("avx512: not requested (add --isa avx512)")
    return {
        "system": system,
        "settings": {**_settings_record(settings), "depths": list(depths), "steps": steps},
        "rows": rows,
        "ratios": [],
        "kernel_cases": cases,
        "notes": [*KERNEL_NOTES, *CASE_NOTES, *skipped],
    }


def _settings_record(settings: bm.BenchSettings) -> dict[str, Any]:
    return {
        "n_prompt": list(settings.n_prompt),
        "n_gen": list(settings.n_gen),
        "depths": list(settings.depths),
        "reps": settings.reps,
        "isas": list(settings.isas),
        "kv": {arm.label: arm.kv for arm in settings.arms},
    }
