"""The `spinkv` command: the typer app and the one place errors become output."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import traceback
from collections.abc import Sequence
from typing import Annotated, Any

import typer

from spinkv.bench import command as bench
from spinkv.chat import command as chat
from spinkv.chat import run_command as run
from spinkv.cli.failures import describe, is_internal_error, user_error_types
from spinkv.cli.render import print_error, stderr, steps_for
from spinkv.errors import debug_enabled
from spinkv.eval import command as eval_cmd
from spinkv.kv import command as cache
from spinkv.models import command as models
from spinkv.sessions import command as sessions
from spinkv.util import quiet_panics
from spinkv.util.progress import reporting
from spinkv.web import command as web

EXIT_USER_ERROR = 2
EXIT_INTERNAL_ERROR = 1
EXIT_INTERRUPTED = 130
EXIT_BROKEN_PIPE = 141

app = typer.Typer(
    name="spinkv",
    help="A small, fast Llama-family inference runtime with a paged, quantized KV cache.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version(value: bool) -> None:
    if value:
        from spinkv import __version__

        typer.echo(f"spinkv {__version__}")
        raise typer.Exit(0)


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option(
            "--version", "-V", help="Print the version and exit.", callback=_version, is_eager=True
        ),
    ] = False,
) -> None:
    """A small, fast Llama-family inference runtime with a paged, quantized KV cache."""


app.command("run")(run.run)
app.command("chat")(chat.chat)
app.add_typer(models.app, name="models")
app.command("eval")(eval_cmd.eval_command)
app.add_typer(cache.app, name="cache")
app.add_typer(sessions.app, name="sessions")
app.command("bench")(bench.bench_command)
app.command("web")(web.web_command)


ABORTS = (KeyboardInterrupt, typer.Abort)
EXITS = (typer.Exit,)


def run_cli(argv: Sequence[str] | None = None) -> int:
    """Run the CLI and return its exit code; every error is printed here, in one line."""
    command = typer.main.get_command(app)
    _hide_flag_types(command)
    try:
        with reporting(steps_for(stderr, transient=True)):
            outcome = command.main(
                args=list(sys.argv[1:] if argv is None else argv),
                prog_name="spinkv",
                standalone_mode=False,
            )
    except ABORTS:
        return EXIT_INTERRUPTED
    except EXITS as exit_:
        return int(exit_.exit_code)
    except typer.TyperException as usage:  # click's usage errors: bad flag, bad value
        if type(usage).__name__ == "NoArgsIsHelpError":
            usage.show()  # type: ignore[attr-defined]
            return EXIT_USER_ERROR
        _show_debug_traceback()
        context = getattr(usage, "ctx", None)
        hint = f" (see '{context.command_path} --help')" if context is not None else ""
        format_message = getattr(usage, "format_message", None)
        print_error((format_message() if format_message else str(usage)) + hint)
        return EXIT_USER_ERROR
    except BrokenPipeError:
        _silence_stdout()
        return EXIT_BROKEN_PIPE
    except SystemExit as exit_:
        # Typer turns a broken pipe it sees into `sys.exit(1)`, even outside standalone mode.
        if isinstance(exit_.__context__, BrokenPipeError):
            _silence_stdout()
            return EXIT_BROKEN_PIPE
        raise
    except user_error_types() as error:
        _show_debug_traceback()
        if is_internal_error(error):
            print_error(f"{describe(error)} (set SPINKV_DEBUG=1 for details)")
            return EXIT_INTERNAL_ERROR
        print_error(describe(error))
        return EXIT_USER_ERROR
    except Exception as bug:
        _show_debug_traceback()
        print_error(
            f"unexpected {type(bug).__name__}: {describe(bug)} "
            "(set SPINKV_DEBUG=1 to see the traceback)"
        )
        return EXIT_INTERNAL_ERROR
    return outcome if isinstance(outcome, int) else 0


def _hide_flag_types(command: object) -> None:
    """typer's help prints flags as `--json <bool>`, as if they took a value: an empty
    metavar leaves the type column blank for them."""
    for param in getattr(command, "params", []):
        if getattr(param, "is_flag", False) and param.metavar is None:
            param.metavar = ""
    make_help_option = getattr(command, "get_help_option", None)
    if make_help_option is not None:

        def help_option(ctx: object, make: Any = make_help_option) -> Any:
            option = make(ctx)
            if option is not None and option.metavar is None:
                option.metavar = ""
            return option

        command.get_help_option = help_option  # type: ignore[attr-defined]
    for sub in getattr(command, "commands", {}).values():
        _hide_flag_types(sub)


def main() -> None:
    """Console-script entry point."""
    # Ctrl-C stops a reply (chat, run): a parent that started us with SIGINT ignored (a
    # background job of a non-interactive shell) must not turn that off.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    # `kill` (SIGTERM) unwinds like an exception, so imports and saves remove their temp files.
    signal.signal(signal.SIGTERM, _terminate)
    _stand_in_for_closed_streams()
    _tolerate_bad_utf8()
    quiet_panics.hold_stderr()
    code = run_cli()
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        _silence_stdout()
        code = EXIT_BROKEN_PIPE
    sys.exit(code)


def _terminate(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def _stand_in_for_closed_streams() -> None:
    """A standard stream closed by the caller (`spinkv run hi >&-`) is None in Python: it reads
    as empty and writes go nowhere, as for a shell command, instead of an AttributeError."""
    for name, mode in (("stdin", "r"), ("stdout", "w"), ("stderr", "w")):
        if getattr(sys, name) is None:
            setattr(sys, name, open(os.devnull, mode, encoding="utf-8"))  # noqa: SIM115


def _tolerate_bad_utf8() -> None:
    """Bytes on stdin that are not UTF-8 read as U+FFFD instead of ending the command (or
    the chat) with a decoding error."""
    reconfigure = getattr(sys.stdin, "reconfigure", None)
    if reconfigure is not None:
        with contextlib.suppress(ValueError, OSError):
            reconfigure(errors="replace")


def _show_debug_traceback() -> None:
    if debug_enabled():
        traceback.print_exc(file=sys.stderr)


def _silence_stdout() -> None:
    """After a closed pipe, point stdout at /dev/null so the interpreter's final flush
    does not raise again."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
