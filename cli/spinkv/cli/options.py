"""Options shared by the commands that generate text (run, chat; later eval and bench)."""

from __future__ import annotations

import os
from enum import Enum
from typing import Annotated, Any, Optional

import typer

from spinkv.errors import InvalidInputError, SpinkvError
from spinkv.kv.options import KV_PRESETS, kv_options
from spinkv.sampling import CHAT_DEFAULTS, SamplingParams, sampling_with

KvPreset = Enum("KvPreset", {name: name for name in KV_PRESETS}, type=str)  # type: ignore[misc]
"""--kv's choices: the runtime's presets."""


class IsaName(str, Enum):
    """Instruction sets the kernels are written for (forcing one the CPU lacks is an error)."""

    scalar = "scalar"
    avx2 = "avx2"
    avx512 = "avx512"
    neon = "neon"
    simd128 = "simd128"


def choice_value(value: Enum | str | None) -> str | None:
    """The string of an Enum-typed option (typer hands over the member)."""
    return value.value if isinstance(value, Enum) else value


GENERATION = "Generation"
SAMPLING = "Sampling"
KV_CACHE = "KV cache"
OUTPUT = "Output"

DEFAULTS = CHAT_DEFAULTS

ModelOption = Annotated[
    Optional[str],
    typer.Option(
        "--model",
        "-m",
        help="Model: a local HF directory, a name in the store, a .gguf file (imported into "
        "the store) or an HF repo id org/name (default: SmolLM2-135M-Instruct).",
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
MAX_THREADS = 1024

ThreadsOption = Annotated[
    Optional[int],
    typer.Option(
        "--threads",
        "-t",
        help="Threads for matrix work, 1..1024 (default: all cores).",
        show_default=False,
        min=1,
        max=MAX_THREADS,
        rich_help_panel=GENERATION,
    ),
]
TemperatureOption = Annotated[
    Optional[float],
    typer.Option(
        "--temperature",
        help=f"0 is exact greedy decoding (the repetition penalty is then off unless given). "
        f"[default: {DEFAULTS.temperature}]",
        show_default=False,
        rich_help_panel=SAMPLING,
    ),
]
TopKOption = Annotated[
    Optional[int],
    typer.Option(
        "--top-k",
        help=f"Keep the k likeliest tokens; 0 is off. [default: {DEFAULTS.top_k}]",
        show_default=False,
        rich_help_panel=SAMPLING,
    ),
]
TopPOption = Annotated[
    Optional[float],
    typer.Option(
        "--top-p",
        help=f"Nucleus sampling mass in (0, 1]; 1 is off. [default: {DEFAULTS.top_p}]",
        show_default=False,
        rich_help_panel=SAMPLING,
    ),
]
MinPOption = Annotated[
    Optional[float],
    typer.Option(
        "--min-p",
        help=f"Drop tokens below min-p x the top probability; 0 is off. "
        f"[default: {DEFAULTS.min_p}]",
        show_default=False,
        rich_help_panel=SAMPLING,
    ),
]
RepeatPenaltyOption = Annotated[
    Optional[float],
    typer.Option(
        "--repeat-penalty",
        help=f"Repetition penalty; 1 is off. [default: {DEFAULTS.repetition_penalty}]",
        show_default=False,
        rich_help_panel=SAMPLING,
    ),
]
RepeatLastNOption = Annotated[
    Optional[int],
    typer.Option(
        "--repeat-last-n",
        help=f"Recent tokens the repetition penalty sees. [default: {DEFAULTS.repeat_last_n}]",
        show_default=False,
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
    Optional[KvPreset],
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
    Optional[IsaName],
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


def sampling_flags(
    *,
    temperature: float | None,
    top_k: int | None,
    top_p: float | None,
    min_p: float | None,
    repeat_penalty: float | None,
    repeat_last_n: int | None,
    seed: int | None,
) -> dict[str, Any]:
    """The sampling settings given on the command line (SamplingParams field names; flags
    not given are left out)."""
    given = {
        "temperature": temperature,
        "top_k": top_k,
        "top_p": top_p,
        "min_p": min_p,
        "repetition_penalty": repeat_penalty,
        "repeat_last_n": repeat_last_n,
        "seed": seed,
    }
    return {key: value for key, value in given.items() if value is not None}


def sampling_from_flags(**flags: Any) -> SamplingParams:
    """Validated sampling settings: the chat defaults overridden by the flags given; raises
    InvalidInputError naming a bad value."""
    return sampling_with(sampling_flags(**flags))


def kv_from_flags(
    *,
    preset: KvPreset | str | None,
    k_bits: float | None,
    v_bits: float | None,
    window: int | None,
    page_tokens: int | None,
    max_context: int | None = None,
    sink_tokens: int | None = None,
) -> dict[str, Any] | None:
    """The `kv` dict for Model.session(); the runtime validates the values."""
    return kv_options(
        choice_value(preset),
        k_bits=k_bits,
        v_bits=v_bits,
        window=window,
        page_tokens=page_tokens,
        max_context=max_context,
        sink_tokens=sink_tokens,
    )


def force_isa(isa: IsaName | str | None) -> None:
    """Select the kernels' instruction set for this process (--isa). None keeps the default:
    SPINKV_ISA if set (an ISA this CPU lacks is an error, as for --isa), else the best."""
    source = "--isa"
    name = choice_value(isa)
    if name is None:
        name = os.environ.get("SPINKV_ISA", "").strip() or None
        source = "SPINKV_ISA"
    if name is None:
        return
    from spinkv import _native

    try:
        _native.set_isa(name)
    except SpinkvError as exc:
        raise InvalidInputError(f"{source} {name}: {exc}") from None
