"""`spinkv models pull|import-gguf|list|info`: the model store."""

from __future__ import annotations

import json
import sys
from enum import Enum
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from rich.table import Table
from rich.text import Text

from spinkv.cli import options as opt
from spinkv.cli.render import (
    format_bytes,
    format_count,
    key_value_table,
    print_note,
    stdout,
)
from spinkv.util.safetensors_io import DTYPES

app = opt.command_group("Pull, import, list and inspect models.")


WeightDtype = Enum(  # type: ignore[misc]
    "WeightDtype", {name: name for name in DTYPES if name != "f32"}, type=str
)
"""--dtype's choices: the weight dtypes the safetensors writer has (f32 is for tests)."""


StoreNameOption = Annotated[
    Optional[str],
    typer.Option("--name", help="Name in the store (default: from the file).", show_default=False),
]


WEIGHT_DTYPE_HELP = (
    "Weight dtype to write: f16, bf16 or q8_0 (8-bit codes with an f16 scale per 32 weights, "
    "llama.cpp's Q8_0: half the bytes of f16)."
)


@app.command("pull")
def pull(
    name: Annotated[str, typer.Argument(help="Registry name, e.g. smollm2.")],
    dtype: Annotated[WeightDtype, typer.Option("--dtype", help=WEIGHT_DTYPE_HELP)] = (
        WeightDtype.f16
    ),
) -> None:
    """Import a known model into the store (f16 as NAME; another --dtype as NAME-DTYPE)."""
    from spinkv.models.store import pull as pull_model

    path = pull_model(name, dtype=dtype.value)
    print_note(f"{name} is ready at {path}")


@app.command("import-gguf")
def import_gguf(
    file: Annotated[Path, typer.Argument(help="A Llama-family .gguf file.")],
    name: StoreNameOption = None,
    dtype: Annotated[WeightDtype, typer.Option("--dtype", help=WEIGHT_DTYPE_HELP)] = (
        WeightDtype.f16
    ),
    force: Annotated[
        bool,
        typer.Option("--force", help="Replace a model of the same name imported from elsewhere."),
    ] = False,
) -> None:
    """Convert a GGUF file into an HF-layout model in the store."""
    from spinkv.models.gguf_import import import_gguf as convert

    path = convert(file, name=name, dtype=dtype.value, replace=force)
    print_note(f"imported {file} into {path}")


@app.command("list")
def list_models(json_output: opt.JsonOption = False) -> None:
    """The models in the store; one the runtime would refuse to load is marked broken, with
    why."""
    from spinkv.models.store import list_models as stored_models

    infos = stored_models()
    if json_output:
        _print_json([{"problem": None, **info.to_dict()} for info in infos])
        return
    if not infos:
        print_note("no models yet: `spinkv models pull smollm2` imports the default one")
        return
    stdout.print(models_table(infos))


@app.command("info")
def info(
    name: Annotated[str, typer.Argument(help="A store name, a local directory or an HF repo id.")],
    json_output: opt.JsonOption = False,
) -> None:
    """Details of one model (a .gguf file not imported yet is read without adding it)."""
    from spinkv.models.store import model_info, store_entry_name, viewed_model

    with viewed_model(name) as path:
        details = model_info(path, name=store_entry_name(name))
    if json_output:
        _print_json(details.to_dict())
        return
    stdout.print(key_value_table(info_rows(details), title=details.name))


@app.command("rm")
def remove(name: Annotated[str, typer.Argument(help="A model name in the store.")]) -> None:
    """Delete a model from the store (a link in it: the link only)."""
    from spinkv.models.store import remove_model

    path, link_target = remove_model(name)
    if link_target is None:
        print_note(f"removed {path}")
    else:
        print_note(f"removed the link {path} (its target {link_target} is kept)")


def models_table(infos: list[Any]) -> Table:
    """One row per model; a BrokenModel's row says "broken: WHY" in the status column."""
    from spinkv.models.info import BrokenModel

    table = Table(show_edge=False)
    for column in (
        "name",
        "architecture",
        "parameters",
        "dtype",
        "size",
        "context",
        "KV/token fp16",
        "status",
    ):
        table.add_column(
            column,
            justify="left" if column in ("name", "architecture", "status") else "right",
            overflow="fold",
        )
    for info in infos:
        if isinstance(info, BrokenModel):
            problem = Text(f"broken: {info.problem}", style="red")
            table.add_row(info.name, "", "", "", "", "", "", problem)
            continue
        table.add_row(
            info.name,
            info.architecture,
            format_count(info.parameters),
            info.dtype,
            format_bytes(info.size_bytes),
            str(info.context_length),
            format_bytes(info.kv_bytes_per_token),
            "ok",
        )
    return table


def info_rows(details: Any) -> dict[str, Any]:
    return {
        "path": str(details.path),
        "architecture": details.architecture,
        "parameters": f"{details.parameters:,} ({format_count(details.parameters)})",
        "dtype": details.dtype,
        "size on disk": format_bytes(details.size_bytes),
        "context length": details.context_length,
        "layers": details.n_layers,
        "hidden size": details.hidden_size,
        "attention heads": f"{details.n_heads} query, {details.n_kv_heads} KV",
        "head dim": details.head_dim,
        "vocab size": details.vocab_size,
        "KV bytes per token (fp16)": f"{details.kv_bytes_per_token:,}",
    }


def _print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, ensure_ascii=False) + "\n")
