"""`spinkv sessions list|show|export|rm`: conversations saved by `spinkv chat --session`."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from enum import Enum
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from rich.table import Table
from rich.text import Text

from spinkv.cli import options as opt
from spinkv.cli.render import format_bytes, key_value_table, print_note, stdout

app = opt.command_group("List, inspect, export and delete saved chat sessions.")


class ExportFormat(str, Enum):
    markdown = "markdown"
    md = "md"
    json = "json"


OutputOption = Annotated[
    Optional[Path],
    typer.Option("--output", "-o", help="Write to a file instead of stdout.", show_default=False),
]
NameArgument = Annotated[str, typer.Argument(help="A session name (see `spinkv sessions list`).")]


@app.command("list")
def list_sessions(json_output: opt.JsonOption = False) -> None:
    """Saved sessions: model, KV preset, turns, tokens, size on disk, last used."""
    from spinkv.sessions.store import list_sessions as stored
    from spinkv.sessions.store import sessions_dir

    infos = stored()
    if json_output:
        _print_json([info.to_dict() for info in infos])
        return
    if not infos:
        print_note(f"no sessions yet in {sessions_dir()}: `spinkv chat --session NAME` starts one")
        return
    stdout.print(sessions_table(infos))


@app.command("show")
def show(name: NameArgument, json_output: opt.JsonOption = False) -> None:
    """One session: its conversation facts, cache identity record and integrity."""
    from spinkv.sessions.store import show_session

    details = show_session(name)
    if json_output:
        _print_json(details)
        return
    identity = details.pop("identity")
    rows = {
        "path": details["path"],
        "model": details["model"],
        "KV preset": details["preset"],
        "turns": details["turns"],
        "tokens": details["tokens"],
        "size on disk": format_bytes(details["size_bytes"]),
        "created": details["created"] or "-",
        "last used": details["last_used"],
        "system prompt": details["system"]
        if details["system"] is not None
        else "(template default)",
        "sampling": ", ".join(f"{k}={v}" for k, v in (details["sampling"] or {}).items()),
        "integrity": "checksums ok",
    }
    stdout.print(key_value_table(rows, title=name))
    stdout.print(key_value_table(identity, title="cache identity"))


@app.command("export")
def export(
    name: NameArgument,
    fmt: Annotated[
        ExportFormat, typer.Option("--format", "-f", help="Output format.", show_default=True)
    ] = ExportFormat.markdown,
    output: OutputOption = None,
) -> None:
    """The conversation as Markdown or JSON (works even when the KV pages are damaged)."""
    from spinkv.sessions.store import export_transcript, write_export

    text = export_transcript(name, "json" if fmt is ExportFormat.json else "markdown")
    if output is None:
        sys.stdout.write(text)
    else:
        write_export(output, text)
        print_note(f"wrote {output}")


@app.command("rm")
def remove(names: Annotated[list[str], typer.Argument(help="Session names.")]) -> None:
    """Delete sessions."""
    from spinkv.sessions.store import remove_session

    for name in names:
        print_note(f"removed {remove_session(name)}")


def sessions_table(infos: Sequence[Any]) -> Table:
    table = Table(show_edge=False)
    for column in ("name", "model", "preset", "turns", "tokens", "size", "last used"):
        left = column in ("name", "model", "preset", "last used")
        table.add_column(column, justify="left" if left else "right", overflow="fold")
    for info in infos:
        if info.error:
            problem = Text(f"unreadable: {info.error}", style="red")
            table.add_row(info.name, problem, "", "", "", format_bytes(info.size), "")
            continue
        table.add_row(
            info.name,
            info.model,
            info.preset,
            str(info.turns),
            str(info.tokens),
            format_bytes(info.size),
            info.updated,
        )
    return table


def _print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, ensure_ascii=False, default=str) + "\n")
