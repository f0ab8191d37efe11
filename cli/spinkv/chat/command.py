"""`spinkv chat`: a streaming REPL whose KV cache is kept between turns."""

from __future__ import annotations

import contextlib
import shutil
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Callable, Optional

import typer

from spinkv.chat.history import LineHistory
from spinkv.cli import options as opt
from spinkv.cli.failures import describe, user_error_types
from spinkv.cli.render import (
    WordWrapper,
    key_value_table,
    print_error,
    print_note,
    print_timings,
    stderr,
    write_text,
)
from spinkv.errors import ContextOverflowError, InvalidInputError
from spinkv.sampling import SamplingParams, sampling_with

if TYPE_CHECKING:
    from spinkv.api import ChatSession, RestoreOutcome
    from spinkv.sessions.store import Transcript
    from spinkv.util.files import Lease

SessionOption = Annotated[
    Optional[str],
    typer.Option(
        "--session",
        help="Resume the saved session NAME (or start it) and save it after every turn. "
        "Its model, KV cache options, sampler settings and system prompt apply unless "
        "given here.",
        show_default=False,
        rich_help_panel=opt.GENERATION,
    ),
]

BLOCK_QUOTE = '"""'
PROMPT = ">>> "
CONTINUATION = "... "

HELP = """\
/help            this list
/clear           forget the conversation (keeps the system prompt)
/system [TEXT]   set the system prompt; without TEXT, back to the template's default
/stats [layers]  KV cache statistics (per layer with 'layers')
/save [NAME]     save the conversation and its KV cache (then autosave to NAME)
/load NAME       continue a saved session (its cache is reused if it fits this model)
/sessions        list saved sessions
/exit            leave (also /quit, /bye, Ctrl-D, or Ctrl-C twice at the prompt)
\"\"\"           start and end a multi-line message
Ctrl-C           stop the reply being written; the conversation keeps what was shown"""


def read_message(read_line: Callable[[str], str], prompt: str = PROMPT) -> str:
    """One user message: a line, or a block between triple quotes spanning lines.

    Raises EOFError at end of input (Ctrl-D) and KeyboardInterrupt on Ctrl-C.
    """
    first = read_line(prompt)
    if not first.lstrip().startswith(BLOCK_QUOTE):
        return first
    body = first.lstrip()[len(BLOCK_QUOTE) :]
    if body.rstrip().endswith(BLOCK_QUOTE):
        return body.rstrip()[: -len(BLOCK_QUOTE)]
    lines = [body] if body else []
    while True:
        line = read_line(CONTINUATION if prompt else "")
        if line.rstrip().endswith(BLOCK_QUOTE):
            last = line.rstrip()[: -len(BLOCK_QUOTE)]
            if last:
                lines.append(last)
            return "\n".join(lines)
        lines.append(line)


def parse_command(line: str) -> tuple[str, str] | None:
    """('/name', 'argument text') for a slash command, None for a message."""
    stripped = line.strip()
    if not stripped.startswith("/") or stripped.startswith("//"):
        return None
    name, _, argument = stripped.partition(" ")
    return name.lower(), argument.strip()


class ChatRepl:
    """Reads messages, streams replies, runs slash commands."""

    def __init__(
        self,
        chat: ChatSession,
        *,
        quiet: bool,
        verbose: bool,
        session_name: str | None = None,
        lease: Lease | None = None,
    ) -> None:
        self.chat = chat
        self.quiet = quiet
        self.verbose = verbose
        self.interactive = sys.stdin.isatty()
        self.replies = 0
        self.pending_interrupts = 0
        self.session_name = session_name
        self.lease = lease  # this process's claim on session_name (see sessions.claim_session)

    def loop(self) -> None:
        if self.interactive and not self.quiet:
            print_note(
                f"spinkv chat · {self.chat.model.info['name']} · /help for commands · "
                "Ctrl-D to leave"
            )
        while True:
            try:
                line = read_message(input, PROMPT if self.interactive else "")
            except EOFError:
                if self.interactive:
                    stderr.print()
                return
            except KeyboardInterrupt:
                stderr.print()
                self.pending_interrupts += 1
                if self.pending_interrupts >= 2:
                    return
                print_note("(Ctrl-C again or Ctrl-D to leave)")
                continue
            self.pending_interrupts = 0
            try:
                if not self.handle(line):
                    return
            except KeyboardInterrupt:  # between the reply and the prompt: back to the prompt
                stderr.print()

    def handle(self, line: str) -> bool:
        """A message or a slash command; False means leave."""
        if not line.strip():
            return True
        command = parse_command(line)
        if command is None:
            self.reply(line)
            return True
        return self.run_command(*command)

    def reply(self, text: str) -> None:
        try:
            stream = self.chat.send(text)
        except KeyboardInterrupt:
            self.chat.cancel()
            return
        except ContextOverflowError as exc:
            print_error(f"{exc}: {self.overflow_hint()}")
            return
        except user_error_types() as exc:
            print_error(describe(exc))
            return
        out: Callable[[str], None] = write_text
        wrapper = None
        if sys.stdout.isatty():
            wrapper = WordWrapper(shutil.get_terminal_size().columns)
            out = wrapper
        try:
            for piece in stream:
                out(piece)
        except KeyboardInterrupt:
            stream.close()
        except user_error_types() as exc:
            write_text("\n")
            print_error(describe(exc))
            return
        finally:
            if wrapper is not None:
                wrapper.flush()
        result = stream.result
        if result.text and not result.text.endswith("\n"):
            write_text("\n")
        if not self.quiet:
            print_timings(result, verbose=self.verbose, show_load=self.replies == 0)
        elif result.finish_reason == "interrupted":
            print_note("[interrupted]")
        self.replies += 1
        self.autosave()

    def overflow_hint(self) -> str:
        """What gets a turn the context refused through: a sliding chat refuses only a message
        that does not fit beside the system prompt; one that does not slide, the conversation."""
        if self.chat.slide:
            system = ", change the system prompt (/system)" if self.chat.system else ""
            return f"shorten the message{system} or raise --max-context"
        saved = " (the saved session is replaced at its next save)" if self.session_name else ""
        return f"raise --max-context, or /clear starts a new conversation{saved}"

    def autosave(self) -> None:
        """Saves the bound session after a turn; a failure is reported, never fatal."""
        if self.session_name is not None:
            self.save(self.session_name, quiet=True)

    def bind(self, name: str) -> bool:
        """Claim session `name` for this chat (releasing the previous one); False if another
        process holds it (reported)."""
        from spinkv.sessions.store import claim_session

        if name == self.session_name and self.lease is not None:
            return True
        try:
            lease = claim_session(name)
        except user_error_types() as exc:
            print_error(describe(exc))
            return False
        if self.lease is not None:
            self.lease.release()
        self.lease, self.session_name = lease, name
        return True

    def save(self, name: str, *, quiet: bool = False) -> None:
        from spinkv.sessions.store import save_chat, session_path

        previous = self.session_name
        if not self.bind(name):
            print_error(f"session {name} was not saved")
            return
        try:
            size = save_chat(self.chat, session_path(name))
        except user_error_types() as exc:
            print_error(f"session {name} was not saved: {describe(exc)}")
            self.rebind(previous)
            return
        if not quiet:
            print_note(f"saved session {name} ({self.chat.stats()['turns']} turns, {size:,} bytes)")

    def load(self, name: str) -> None:
        from spinkv.sessions.store import existing_session, restore_chat

        try:
            path = existing_session(name)
        except user_error_types() as exc:
            print_error(describe(exc))
            return
        previous = self.session_name
        if not self.bind(name):
            return
        try:
            outcome = restore_chat(self.chat, path)
        except user_error_types() as exc:
            print_error(describe(exc))
            self.rebind(previous)
            return
        print_note(restore_note(name, outcome))

    def rebind(self, previous: str | None) -> None:
        """After a failed /save or /load: autosave where we were, not to the failed name."""
        if previous == self.session_name:
            return
        if self.lease is not None:
            self.lease.release()
        self.session_name, self.lease = None, None
        if previous is not None:
            self.bind(previous)

    def list_sessions(self) -> None:
        from spinkv.sessions.command import sessions_table
        from spinkv.sessions.store import list_sessions

        infos = list_sessions()
        if infos:
            stderr.print(sessions_table(infos))
        else:
            print_note("no saved sessions")

    def show_stats(self, *, per_layer: bool) -> None:
        from spinkv.kv.command import render_cache_stats

        stats = self.chat.stats()
        conversation = {
            "turns": stats["turns"],
            "tokens in cache": stats["cached_tokens"],
            "tokens retired (slid out)": stats["retired_tokens"],
            "context limit": stats["max_context"],
            "when full": "slide (oldest pages retired)" if stats["sliding_window"] else "stop",
        }
        if stats["context_start"]:  # a long conversation rebuilt from its newest turns
            total = len(self.chat.history)
            conversation["messages rendered"] = f"last {total - stats['context_start']} of {total}"
        stderr.print(key_value_table(conversation, title="conversation"))
        render_cache_stats(stats["cache"], stderr, per_layer=per_layer)

    def run_command(self, name: str, argument: str) -> bool:
        """Runs one slash command; False means leave."""
        if name in ("/exit", "/quit", "/bye"):
            return False
        if name in ("/help", "/?"):
            stderr.print(HELP, markup=False)
        elif name == "/clear":
            self.chat.clear()
            print_note("conversation cleared")
        elif name == "/system":
            try:
                self.chat.set_system(argument or None)
            except user_error_types() as exc:  # the chat goes on with the prompt it had
                print_error(describe(exc))
                return True
            print_note(f"system prompt: {argument}" if argument else "system prompt: default")
        elif name == "/stats":
            self.show_stats(per_layer=argument == "layers" or self.verbose)
        elif name == "/save":
            target = argument or self.session_name
            if target is None:
                print_error("/save needs a name the first time: /save NAME")
            else:
                self.save(target)
        elif name == "/load":
            if argument:
                self.load(argument)
            else:
                print_error("/load needs a session name (/sessions lists them)")
        elif name == "/sessions":
            self.list_sessions()
        else:
            print_error(f"unknown command {name}: /help lists the commands")
        return True


@opt.with_generation_flags
def chat(
    model: opt.ModelOption = None,
    system: opt.SystemOption = None,
    max_tokens: opt.MaxTokensOption = 1024,
    threads: opt.ThreadsOption = None,
    session: SessionOption = None,
    quiet: opt.QuietOption = False,
    verbose: opt.VerboseOption = False,
    flags: opt.GenerationFlags = None,  # type: ignore[assignment]  # by with_generation_flags
) -> None:
    """Chat with a model; the KV cache is kept between turns. /help lists the commands."""
    given_sampling, kv_dict = flags.sampling_given, flags.kv
    sampling = flags.sampling
    opt.force_isa(flags.isa)
    saved: Transcript | None = None
    path: Path | None = None
    lease: Lease | None = None
    if session is not None:
        from spinkv.sessions.store import claim_session, read_transcript, session_path

        path = session_path(session)
        lease = claim_session(session)  # held until this process ends
        if path.exists() or path.is_symlink():
            saved, _ = read_transcript(path)  # unreadable: exit 2, the file stays as it is
            model, kv_dict, sampling = resume_settings(saved, model, kv_dict, given_sampling)

    import spinkv.api as api

    loaded = api.load(model, threads=threads)
    chat_session = loaded.chat(system, kv=kv_dict, sampling=sampling, max_tokens=max_tokens)
    if session is not None and saved is None and not quiet:
        print_note(f"session {session}: new, saved after every turn to {path}")
    if saved is not None and path is not None and session is not None:
        from spinkv.sessions.store import restore_chat

        outcome = restore_chat(chat_session, path, system=system)
        if not quiet or not outcome.reused:
            print_note(restore_note(session, outcome))
    with LineHistory.for_chat(enabled=sys.stdin.isatty()):
        repl = ChatRepl(
            chat_session, quiet=quiet, verbose=verbose, session_name=session, lease=lease
        )
        repl.loop()


def resume_settings(
    saved: Transcript,
    model: str | None,
    kv: dict[str, Any] | None,
    given_sampling: dict[str, Any],
) -> tuple[str | None, dict[str, Any] | None, SamplingParams]:
    """A resumed session's model, KV options and sampler settings, overridden by flags
    (given_sampling: the sampling flags given, by SamplingParams field name)."""
    if model is None:
        recorded = saved.model.get("path")
        if isinstance(recorded, str) and Path(recorded).is_dir():
            model = recorded
        elif saved.model.get("name"):
            print_note(f"the session's model {saved.model['name']} is gone: using the default")
    if saved.kv:
        kv = {**saved.kv, **(kv or {})}
    sampling = sampling_with(given_sampling)
    if saved.sampling:
        with contextlib.suppress(TypeError, ValueError, InvalidInputError):
            sampling = sampling_with(given_sampling, base=SamplingParams(**saved.sampling))
    return model, kv, sampling


def restore_note(name: str, outcome: RestoreOutcome) -> str:
    turns = f"{outcome.turns} turn{'s' if outcome.turns != 1 else ''}"
    if outcome.reused:
        return f"session {name}: resumed {turns}, {outcome.cached_tokens} tokens of KV cache reused"
    return (
        f"session {name}: resumed {turns}; KV cache not reused ({outcome.reason}); "
        f"{re_prefill_note(outcome)}"
    )


def re_prefill_note(outcome: RestoreOutcome) -> str:
    """What the next turn feeds after a refused cache: all of the transcript, or the newest
    messages of one longer than the context (the session file keeps every message)."""
    if outcome.context_start == 0:
        return "the transcript is re-prefilled on the next turn"
    newest, total = outcome.messages - outcome.context_start, outcome.messages
    if newest == 0 and outcome.system_overflows:
        return (
            f"its system prompt alone is {outcome.system_tokens} tokens, more than the "
            f"{outcome.prompt_budget} this context leaves beside the reply: the next turn "
            f"re-reads none of its {total} messages (the session keeps them); raise "
            "--max-context or change the system prompt (--system, or /system in the chat)"
        )
    if newest == 0:
        return (
            "the conversation is longer than the context and its newest turn alone does not "
            f"fit: the next turn re-reads none of its {total} messages (the session keeps them)"
        )
    return (
        "the conversation is longer than the context, so the next turn re-reads the last "
        f"{newest} of {total} messages (the session keeps all of them)"
    )
