"""`spinkv bench`: prefill / decode speed at context depths, per ISA and KV preset,
optionally side by side with llama.cpp; `--kernels` for KV kernel speed per ISA."""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from enum import Enum
from typing import Annotated, Any, Optional

import typer

from spinkv.bench import cases as bm
from spinkv.bench.report import FORMATS, Column, emit, jsonl_line
from spinkv.cli import options as opt
from spinkv.cli.render import progress_bar, stderr, stdout
from spinkv.errors import InvalidInputError
from spinkv.kv.options import DEFAULT_KV_PRESET

LLAMA_KV_DEFAULT = "f16,q8_0,q4_0"

BenchFormat = Enum("BenchFormat", {name: name for name in FORMATS}, type=str)  # type: ignore[misc]
"""--format's choices: the report formats."""

BENCH = "Benchmark"

DepthOption = Annotated[
    Optional[str],
    opt.option(
        "--depth",
        "-d",
        help="Context depths: tokens of text prefilled first (default 0; with --kernels 512,4096).",
        panel=BENCH,
    ),
]
IsaOption = Annotated[
    Optional[str],
    opt.option(
        "--isa",
        help="Instruction sets, e.g. scalar,avx2 (default: the one in use); simd128 adds the "
        "browser build (wasm, run in node) beside native.",
        panel=BENCH,
    ),
]


def _list_option(flag: str, short: str, help_text: str) -> typer.models.OptionInfo:
    return typer.Option(flag, short, help=help_text, rich_help_panel=BENCH)


def bench_command(
    model: opt.ModelOption = None,
    n_prompt: Annotated[
        str, _list_option("--n-prompt", "-p", "Prompt tokens timed at each depth (pp).")
    ] = "512",
    n_gen: Annotated[
        str, _list_option("--n-gen", "-n", "Tokens decoded at each depth (first + steady).")
    ] = "128",
    depth: DepthOption = None,
    reps: Annotated[
        int, typer.Option("--repetitions", "-r", help="Repetitions.", rich_help_panel=BENCH)
    ] = 5,
    isa: IsaOption = None,
    threads: opt.ThreadsOption = None,
    kv: Annotated[
        str,
        typer.Option(
            "--kv",
            help="KV presets, comma separated; per-arm settings as preset:key=value "
            "(e.g. turbo:window=0).",
            rich_help_panel=opt.KV_CACHE,
        ),
    ] = DEFAULT_KV_PRESET,
    k_bits: opt.KBitsOption = None,
    v_bits: opt.VBitsOption = None,
    kv_window: opt.KvWindowOption = None,
    kv_page: opt.KvPageOption = None,
    output: Annotated[
        BenchFormat,
        typer.Option("--format", "-f", help="Output format.", rich_help_panel=opt.OUTPUT),
    ] = BenchFormat.table,  # type: ignore[attr-defined]
    json_output: Annotated[
        bool, typer.Option("--json", help="Same as --format json.", rich_help_panel=opt.OUTPUT)
    ] = False,
    compare_llama_cpp: Annotated[
        bool,
        typer.Option(
            "--compare-llama-cpp",
            help="Also run llama.cpp (llama-cpp-python) on the same model and depths, and "
            "print ours / llama.cpp at its best per depth (f16 KV, flash attention off or on).",
            rich_help_panel=BENCH,
        ),
    ] = False,
    llama_kv: Annotated[
        str,
        typer.Option(
            "--llama-kv",
            help="llama.cpp KV cache types to measure with --compare-llama-cpp: f16 (flash "
            "attention off and on), q8_0, q4_0 (flash attention on).",
            rich_help_panel=BENCH,
        ),
    ] = LLAMA_KV_DEFAULT,
    kernels: Annotated[
        bool,
        typer.Option(
            "--kernels",
            help="KV kernel mode: attend time, K+V scan GB/s and encode ns/token per ISA.",
            rich_help_panel=BENCH,
        ),
    ] = False,
) -> None:
    """Measure prefill and decode speed at context depths (like llama-bench)."""
    from spinkv.eval.arms import parse_arms

    output = "json" if json_output else output.value
    if kernels and compare_llama_cpp:
        raise InvalidInputError("--kernels and --compare-llama-cpp do not go together")
    overrides = {"k_bits": k_bits, "v_bits": v_bits, "window": kv_window, "page_tokens": kv_page}
    settings = bm.BenchSettings(
        n_prompt=bm.parse_int_list(n_prompt, "-p"),
        n_gen=bm.parse_int_list(n_gen, "-n"),
        depths=bm.parse_int_list(depth or "0", "-d"),
        reps=reps,
        isas=bm.parse_name_list(isa, "--isa") if isa is not None else (),
        arms=tuple(parse_arms(kv, overrides)),
    )
    from spinkv.bench import runner as bench_run

    cross_isas: tuple[str, ...] = ()
    with_wasm = False
    if not kernels:
        from spinkv.bench.wasm import split_wasm

        settings, with_wasm = split_wasm(settings)
        if with_wasm and compare_llama_cpp:
            raise InvalidInputError("--isa simd128 and --compare-llama-cpp do not go together")
    if kernels:
        from spinkv.bench.cross import split_cross

        native_isas, cross_isas = split_cross(settings.isas)
        settings = _with_isas(settings, native_isas)
    settings = _with_isas(settings, bench_run.check_isas(settings.isas))
    settings.validate()
    from spinkv.bench.llamacpp import parse_kv_types, require_llama_cpp

    llama_kv_types = parse_kv_types(llama_kv)  # checked even unused: a typo is said
    if compare_llama_cpp:
        require_llama_cpp()
    elif llama_kv != LLAMA_KV_DEFAULT:
        raise InvalidInputError("--llama-kv needs --compare-llama-cpp")

    import spinkv.api as api

    loaded = api.load(model, threads=threads)
    command = _command_line(
        model=model,
        p=n_prompt,
        n=n_gen,
        d=depth,
        r=reps,
        isa=",".join((*settings.isas, *cross_isas, *(("simd128",) if with_wasm else ()))),
        t=threads,
        kv=kv,
        kernels=kernels,
        llama=",".join(llama_kv_types) if compare_llama_cpp else None,
    )
    with progress_bar(stderr) as progress:
        if kernels:
            from spinkv.bench.kernels import KERNEL_COLUMNS

            record = bench_run.run_kernel_benchmark(
                loaded,
                settings,
                progress,
                command=command,
                depths_given=depth is not None,
                cross_isas=cross_isas,
            )
            columns: list[Column] | None = KERNEL_COLUMNS
        elif with_wasm:
            from spinkv.bench.wasm import run_with_wasm

            record = run_with_wasm(loaded, settings, progress, command=command)
            columns = None
        else:
            record = bench_run.run_benchmark(
                loaded,
                settings,
                progress,
                command=command,
                compare_llama_cpp=compare_llama_cpp,
                llama_kv=llama_kv_types,
                on_row=_print_jsonl if output == "jsonl" else None,
            )
            columns = None
    emit(record, output, out=stdout, columns=columns, streamed=output == "jsonl" and not kernels)


def _command_line(
    *,
    model: str | None,
    p: str,
    n: str,
    d: str | None,
    r: int,
    isa: str,
    t: int | None,
    kv: str,
    kernels: bool,
    llama: str | None,
) -> str:
    """The run as a command line (for the report header), options in a fixed order."""
    parts = ["spinkv", "bench"]
    if kernels:
        parts.append("--kernels")
    parts += ([] if kernels else ["-p", p]) + ["-n", n] + (["-d", d] if d else [])
    parts += ["-r", str(r), "--isa", isa]
    parts += (["-t", str(t)] if t else []) + ["--kv", kv] + (["-m", model] if model else [])
    if llama:
        parts += ["--compare-llama-cpp", "--llama-kv", llama]
    return " ".join(shlex.quote(part) for part in parts)


def _print_jsonl(row: Mapping[str, Any], system: Mapping[str, Any]) -> None:
    """A result row as soon as it is measured (long runs keep what they finished)."""
    stdout.file.write(jsonl_line("result", row, system))
    stdout.file.flush()


def _with_isas(settings: bm.BenchSettings, isas: tuple[str, ...]) -> bm.BenchSettings:
    from dataclasses import replace

    return replace(settings, isas=isas)
