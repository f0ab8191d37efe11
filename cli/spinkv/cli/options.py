"""Options shared by the commands that generate text (run, chat; later eval and bench)."""

from __future__ import annotations

import functools
import inspect
import os
from collections.abc import Callable
from dataclasses import dataclass
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


def option(*flags: str, help: str, panel: str | None = None, **extra: Any) -> Any:
    """A typer option whose default is never shown by typer (ours say their own)."""
    return typer.Option(*flags, help=help, show_default=False, rich_help_panel=panel, **extra)


def command_group(help: str) -> typer.Typer:
    """A `spinkv NOUN ...` group of subcommands."""
    return typer.Typer(
        help=help, no_args_is_help=True, context_settings={"help_option_names": ["-h", "--help"]}
    )


JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]
ModelOption = Annotated[
    Optional[str],
    option(
        "--model",
        "-m",
        help="Model: a local HF directory, a name in the store, a .gguf file (imported into "
        "the store) or an HF repo id org/name (default: SmolLM2-135M-Instruct).",
    ),
]
SystemOption = Annotated[
    Optional[str],
    option(
        "--system", "-s", help="System prompt (default: the chat template's own).", panel=GENERATION
    ),
]
MaxTokensOption = Annotated[
    int,
    typer.Option(
        "--max-tokens", "-n", help="Most tokens per reply.", rich_help_panel=GENERATION, min=1
    ),
]
MAX_THREADS = 256
"""The runtime's own limit (spinkv-model's `MAX_THREADS`)."""

ThreadsOption = Annotated[
    Optional[int],
    option(
        "--threads",
        "-t",
        help="Threads for matrix work, 1..256 (default: all cores).",
        panel=GENERATION,
        min=1,
        max=MAX_THREADS,
    ),
]


def _sampling_option(flag: str, text: str, default: object) -> Any:
    # The parameter's default is None (flag not given); help shows the sampler's default.
    return typer.Option(flag, help=text, show_default=str(default), rich_help_panel=SAMPLING)


TemperatureOption = Annotated[
    Optional[float],
    _sampling_option(
        "--temperature",
        "0 is exact greedy decoding (the repetition penalty is then off unless given).",
        DEFAULTS.temperature,
    ),
]
TopKOption = Annotated[
    Optional[int],
    _sampling_option("--top-k", "Keep the k likeliest tokens; 0 is off.", DEFAULTS.top_k),
]
TopPOption = Annotated[
    Optional[float],
    _sampling_option("--top-p", "Nucleus sampling mass in (0, 1]; 1 is off.", DEFAULTS.top_p),
]
MinPOption = Annotated[
    Optional[float],
    _sampling_option(
        "--min-p", "Drop tokens below min-p x the top probability; 0 is off.", DEFAULTS.min_p
    ),
]
RepeatPenaltyOption = Annotated[
    Optional[float],
    _sampling_option(
        "--repeat-penalty", "Repetition penalty; 1 is off.", DEFAULTS.repetition_penalty
    ),
]
RepeatLastNOption = Annotated[
    Optional[int],
    _sampling_option(
        "--repeat-last-n", "Recent tokens the repetition penalty sees.", DEFAULTS.repeat_last_n
    ),
]
SeedOption = Annotated[
    Optional[int],
    option("--seed", help="Random seed (sampling at temperature > 0).", panel=SAMPLING),
]
KvPresetOption = Annotated[
    Optional[KvPreset],
    option(
        "--kv",
        help="KV cache preset: turbo (default: keys 3.5 bits, values 3 bits, the last 256 and "
        "first 4 tokens in fp16), fp16, turbo-qjl, kivi2, kivi4.",
        panel=KV_CACHE,
    ),
]
KBitsOption = Annotated[
    Optional[float], option("--k-bits", help="Key bits per channel.", panel=KV_CACHE)
]
VBitsOption = Annotated[
    Optional[float], option("--v-bits", help="Value bits per channel.", panel=KV_CACHE)
]
KvWindowOption = Annotated[
    Optional[int], option("--kv-window", help="Recent tokens kept in fp16.", panel=KV_CACHE)
]
KvPageOption = Annotated[
    Optional[int], option("--kv-page", help="Tokens per cache page.", panel=KV_CACHE)
]
MaxContextOption = Annotated[
    Optional[int],
    option(
        "--max-context",
        help="Most tokens the KV cache holds (default: the model's context). In chat, a full "
        "cache slides: its oldest pages after the first are retired.",
        panel=KV_CACHE,
    ),
]
SinkTokensOption = Annotated[
    Optional[int],
    option(
        "--sink-tokens",
        help="Leading tokens kept in fp16 for the life of the cache (attention sinks).",
        panel=KV_CACHE,
    ),
]
SparseVOption = Annotated[
    Optional[float],
    option(
        "--sparse-v",
        help="Sparse values: skip a compressed page's values when every attention weight in it "
        "is below this fraction of the softmax sum (turbo: 0.0003; 0 reads every page).",
        panel=KV_CACHE,
    ),
]
ISA_HELP = (
    "Force an instruction set: scalar, avx2, avx512, neon (default: the best the CPU has; "
    "SPINKV_ISA does the same)."
)
RunIsaOption = Annotated[Optional[IsaName], option("--isa", help=ISA_HELP)]
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


SAMPLING_FLAGS: dict[str, tuple[str, Any]] = {
    # parameter name: (SamplingParams field, option type)
    "temperature": ("temperature", TemperatureOption),
    "top_k": ("top_k", TopKOption),
    "top_p": ("top_p", TopPOption),
    "min_p": ("min_p", MinPOption),
    "repeat_penalty": ("repetition_penalty", RepeatPenaltyOption),
    "repeat_last_n": ("repeat_last_n", RepeatLastNOption),
    "seed": ("seed", SeedOption),
}
KV_FLAGS: dict[str, tuple[str, Any]] = {
    # parameter name: (kv_options keyword, option type)
    "kv": ("preset", KvPresetOption),
    "k_bits": ("k_bits", KBitsOption),
    "v_bits": ("v_bits", VBitsOption),
    "kv_window": ("window", KvWindowOption),
    "kv_page": ("page_tokens", KvPageOption),
    "max_context": ("max_context", MaxContextOption),
    "sink_tokens": ("sink_tokens", SinkTokensOption),
    "sparse_v": ("sparse_v", SparseVOption),
}


@dataclass(frozen=True)
class GenerationFlags:
    """The sampling, KV cache and --isa flags that run and chat share, as given."""

    sampling_given: dict[str, Any]
    """The sampling flags given, by SamplingParams field name (flags not given left out)."""
    kv: dict[str, Any] | None
    """The `kv` dict for Model.session(); the runtime validates the values."""
    isa: IsaName | str | None

    @property
    def sampling(self) -> SamplingParams:
        """Validated sampling settings: the chat defaults overridden by the flags given;
        raises InvalidInputError naming a bad value."""
        return sampling_with(self.sampling_given)

    @classmethod
    def from_values(cls, values: dict[str, Any]) -> GenerationFlags:
        sampling = {
            field: values[name]
            for name, (field, _) in SAMPLING_FLAGS.items()
            if values[name] is not None
        }
        kv = {keyword: values[name] for name, (keyword, _) in KV_FLAGS.items()}
        preset = choice_value(kv.pop("preset"))
        return cls(sampling, kv_options(preset, **kv), values["isa"])


def with_generation_flags(command: Callable[..., None]) -> Callable[..., None]:
    """Give a command the shared generation flags: they are added to its signature (after
    its own parameters) and reach it as one `flags: GenerationFlags` argument."""
    own = [p for p in inspect.signature(command, eval_str=True).parameters.values()]
    if [p.name for p in own].count("flags") != 1:
        raise TypeError(f"{command.__name__} needs a `flags` parameter")
    shared = {
        **{name: kind for name, (_, kind) in SAMPLING_FLAGS.items()},
        **{name: kind for name, (_, kind) in KV_FLAGS.items()},
        "isa": RunIsaOption,
    }
    added = [
        inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=None, annotation=kind)
        for name, kind in shared.items()
    ]
    kept = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in own if p.name != "flags"]

    @functools.wraps(command)
    def with_flags(**values: Any) -> None:
        given = {name: values.pop(name) for name in shared}
        command(flags=GenerationFlags.from_values(given), **values)

    parameters = kept + added
    with_flags.__signature__ = inspect.Signature(parameters)  # type: ignore[attr-defined]
    with_flags.__annotations__ = {p.name: p.annotation for p in parameters}
    del with_flags.__wrapped__  # type: ignore[attr-defined]
    return with_flags


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
