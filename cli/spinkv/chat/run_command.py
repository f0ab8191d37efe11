"""`spinkv run PROMPT`: one reply, streamed to stdout; timings on stderr."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from spinkv.cli import options as opt
from spinkv.cli.render import print_note, print_timings, write_text
from spinkv.errors import InvalidInputError

PromptArgument = Annotated[
    Optional[str],
    typer.Argument(
        help="The user message. '-' (or no prompt with piped stdin) reads standard input.",
        show_default=False,
    ),
]


PromptCacheOption = Annotated[
    Optional[Path],
    typer.Option(
        "--prompt-cache",
        help="Reuse the longest matching token prefix of the prompt saved in FILE (only under "
        "the same model, tokenizer, template, KV cache options and runtime), then save this "
        "prompt and reply there.",
        show_default=False,
        rich_help_panel=opt.KV_CACHE,
    ),
]


MAX_STDIN_CHARS = 64 << 20
"""A prompt read from stdin stops here (more than any context holds): `yes | spinkv run -`
or `< /dev/zero` is an error, not memory taken until the machine gives out."""


def read_prompt(prompt: str | None) -> str:
    """The prompt from the argument, or from stdin for '-' or when stdin is piped."""
    if prompt == "-" or (prompt is None and not sys.stdin.isatty()):
        prompt = sys.stdin.read(MAX_STDIN_CHARS + 1)
        if len(prompt) > MAX_STDIN_CHARS:
            raise InvalidInputError(
                f"the prompt on stdin is longer than {MAX_STDIN_CHARS:,} characters "
                "(more than any context holds)"
            )
    if prompt is None:
        raise InvalidInputError("no prompt: give one as an argument or pipe it on stdin")
    if not prompt.strip():
        raise InvalidInputError("the prompt is empty")
    return prompt


def kv_cache_record(session: Any, identity_extra: dict[str, str]) -> dict[str, str]:
    """The cache policy the runtime applied, as its identity record names it."""
    identity = dict(session.identity(identity_extra))
    return {key: str(identity[key]) for key in ("bit_allocation", "recent_window", "page_size")}


@opt.with_generation_flags
def run(
    prompt: PromptArgument = None,
    model: opt.ModelOption = None,
    system: opt.SystemOption = None,
    max_tokens: opt.MaxTokensOption = 512,
    threads: opt.ThreadsOption = None,
    raw: Annotated[
        bool,
        typer.Option("--raw", help="Tokenize the prompt as is, without the chat template."),
    ] = False,
    prompt_cache: PromptCacheOption = None,
    json_output: Annotated[
        bool,
        typer.Option(
            "--json",
            help="Print one JSON record (text, token counts, finish reason, timings).",
            rich_help_panel=opt.OUTPUT,
        ),
    ] = False,
    quiet: opt.QuietOption = False,
    verbose: opt.VerboseOption = False,
    flags: opt.GenerationFlags = None,  # type: ignore[assignment]  # by with_generation_flags
) -> None:
    """Generate one reply to PROMPT (sampled like ollama by default; --temperature 0 is greedy)."""
    sampling, kv_dict = flags.sampling, flags.kv
    opt.force_isa(flags.isa)
    text = read_prompt(prompt)

    import spinkv.api as api
    from spinkv.sessions import store as sessions

    loaded = api.load(model, threads=threads)
    session = loaded.session(kv_dict)
    cache = None
    if prompt_cache is not None:
        cache = sessions.open_prompt_cache(session, loaded.identity_extra, prompt_cache)
    stream = loaded.stream(
        text,
        system=system,
        max_tokens=max_tokens,
        sampling=sampling,
        kv=kv_dict,
        raw=raw,
        session=session,
    )

    def store_cache() -> None:
        if cache is None or stream.result.finish_reason == "interrupted":
            return
        cache.reused_tokens = stream.result.cached_tokens
        transcript = sessions.Transcript(
            kind="prompt",
            messages=[
                {"role": "prompt" if raw else "user", "content": text},
                {"role": "assistant", "content": stream.result.text},
            ],
            system=system,
            model={"name": loaded.info["name"], "path": str(loaded.path)},
            kv=kv_dict,
            sampling=sampling.to_dict(),
            max_tokens=max_tokens,
        )
        sessions.save_prompt_cache(session, loaded.identity_extra, cache.path, transcript)

    if json_output:
        result = stream.read_all()
        store_cache()
        record = {
            "model": loaded.info["name"],
            **result.to_dict(),
            "sampling": sampling.to_dict(),
            "kv_cache": kv_cache_record(session, loaded.identity_extra),
        }
        if cache is not None:
            record["prompt_cache"] = cache.to_dict()
        sys.stdout.write(json.dumps(record, ensure_ascii=False) + "\n")
        return

    try:
        with stream:
            for piece in stream:
                write_text(piece)
    except KeyboardInterrupt:
        write_text("\n")  # end the partial line; the app exits with 130
        raise
    result = stream.result
    if not result.text.endswith("\n"):
        write_text("\n")
    store_cache()
    if not quiet:
        print_timings(result, verbose=verbose)
        if cache is not None:
            print_note(cache.note(result.prompt_tokens))
