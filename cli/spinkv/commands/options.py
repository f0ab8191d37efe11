"""Options shared by the commands that generate text (run, chat; later eval and bench)."""

from __future__ import annotations

from typing import Annotated, Any, Optional

import typer

from spinkv.errors import InvalidInputError
from spinkv.kv_options import kv_options
from spinkv.sampling import SamplingParams

GENERATION = "Generation"
SAMPLING = "Sampling"
KV_CACHE = "KV cache"
OUTPUT = "Output"

DEFAULTS = SamplingParams()

ModelOption = Annotated[
    Optional[str],
    typer.Option(
        "--model",
        "-m",
        help="Model: a local HF directory, a name in the store, or an HF repo id "
        "(default: SmolLM2-135M-Instruct).",
        show_default=False,
    ),
]
SystemOption = Annotated[
    Optional[str],
    typer.Option(
        "--system",
        "-s",
        help="System prompt (default: the chat template's own).",
        show_default=False,
        rich_help_panel=GENERATION,
    ),
]
MaxTokensOption = Annotated[
    int,
    typer.Option("--max-tokens", "-n", help="Most tokens per reply.", rich_help_panel=GENERATION),
]
ThreadsOption = Annotated[
    Optional[int],
    typer.Option(
        "--threads",
        "-t",
        help="Threads for matrix work (default: all cores).",
        show_default=False,
        rich_help_panel=GENERATION,
    ),
]
TemperatureOption = Annotated[
    float,
    typer.Option("--temperature", help="0 is greedy.", rich_help_panel=SAMPLING),
]
TopKOption = Annotated[
    int,
    typer.Option(
        "--top-k", help="Keep the k likeliest tokens; 0 is off.", rich_help_panel=SAMPLING
    ),
]
TopPOption = Annotated[
    float,
    typer.Option(
        "--top-p", help="Nucleus sampling mass in (0, 1]; 1 is off.", rich_help_panel=SAMPLING
    ),
]
MinPOption = Annotated[
    float,
    typer.Option(
        "--min-p",
        help="Drop tokens below min-p x the top probability; 0 is off.",
        rich_help_panel=SAMPLING,
    ),
]
RepeatPenaltyOption = Annotated[
    float,
    typer.Option(
        "--repeat-penalty", help="Repetition penalty; 1 is off.", rich_help_panel=SAMPLING
    ),
]
RepeatLastNOption = Annotated[
    int,
    typer.Option(
        "--repeat-last-n",
        help="Recent tokens the repetition penalty sees.",
        rich_help_panel=SAMPLING,
    ),
]
SeedOption = Annotated[
    Optional[int],
    typer.Option(
        "--seed",
        help="Random seed (sampling at temperature > 0).",
        show_default=False,
        rich_help_panel=SAMPLING,
    ),
]
KvPresetOption = Annotated[
    Optional[str],
    typer.Option(
        "--kv",
        help="KV cache preset: turbo (default: keys 3.5 bits, values 3 bits, 128 recent tokens "
        "in fp16), fp16, turbo-qjl, kivi2, kivi4.",
        show_default=False,
        rich_help_panel=KV_CACHE,
    ),
]
KBitsOption = Annotated[
    Optional[float],
    typer.Option(
        "--k-bits", help="Key bits per channel.", show_default=False, rich_help_panel=KV_CACHE
    ),
]
VBitsOption = Annotated[
    Optional[float],
    typer.Option(
        "--v-bits", help="Value bits per channel.", show_default=False, rich_help_panel=KV_CACHE
    ),
]
KvWindowOption = Annotated[
    Optional[int],
    typer.Option(
        "--kv-window",
        help="Recent tokens kept in fp16.",
        show_default=False,
        rich_help_panel=KV_CACHE,
    ),
]
KvPageOption = Annotated[
    Optional[int],
    typer.Option(
        "--kv-page", help="Tokens per cache page.", show_default=False, rich_help_panel=KV_CACHE
    ),
]
MaxContextOption = Annotated[
    Optional[int],
    typer.Option(
        "--max-context",
        help="Most tokens the KV cache holds (default: the model's context). In chat, a full "
        "cache slides: its oldest pages after the first are retired.",
        show_default=False,
        rich_help_panel=KV_CACHE,
    ),
]
SinkTokensOption = Annotated[
    Optional[int],
    typer.Option(
        "--sink-tokens",
        help="Leading tokens kept in fp16 for the life of the cache (attention sinks).",
        show_default=False,
        rich_help_panel=KV_CACHE,
    ),
]
RunIsaOption = Annotated[
    Optional[str],
    typer.Option(
        "--isa",
        help="Force an instruction set: scalar, avx2, avx512, neon (default: the best the CPU "
        "has; SPINKV_ISA does the same).",
        show_default=False,
    ),
]
QuietOption = Annotated[
    bool,
    typer.Option(
        "--quiet", "-q", help="Only the model's text: no timings.", rich_help_panel=OUTPUT
    ),
]
VerboseOption = Annotated[
    bool,
    typer.Option(
        "--verbose", "-v", help="Add attention / matmul / other time.", rich_help_panel=OUTPUT
    ),
]


def sampling_from_flags(
    *,
    temperature: float,
    top_k: int,
    top_p: float,
    min_p: float,
    repeat_penalty: float,
    repeat_last_n: int,
    seed: int | None,
) -> SamplingParams:
    """Validated sampling settings; raises InvalidInputError naming the bad value."""
    return SamplingParams(
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        min_p=min_p,
        repetition_penalty=repeat_penalty,
        repeat_last_n=repeat_last_n,
        seed=seed,
    )


def kv_from_flags(
    *,
    preset: str | None,
    k_bits: float | None,
    v_bits: float | None,
    window: int | None,
    page_tokens: int | None,
    max_context: int | None = None,
    sink_tokens: int | None = None,
) -> dict[str, Any] | None:
    """The `kv` dict for Model.session(); the runtime validates the values."""
    return kv_options(
        preset,
        k_bits=k_bits,
        v_bits=v_bits,
        window=window,
        page_tokens=page_tokens,
        max_context=max_context,
        sink_tokens=sink_tokens,
    )


def force_isa(name: str | None) -> None:
    """Select the kernels' instruction set for this process (--isa); None keeps the default."""
    if name is None:
        return
    from spinkv import _native

    try:
        _native.set_isa(name)
    except _native.SpinkvError as exc:
        raise InvalidInputError(f"--isa {name}: {exc}") from None
