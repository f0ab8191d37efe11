"""Rendering a model's Jinja2 chat template, the way HF transformers does.

The template comes from tokenizer_config.json ("chat_template": a string, or a list of named
templates of which "default" is used) or from chat_template.jinja. It is rendered in a
sandboxed Jinja2 environment with trim_blocks and lstrip_blocks, the loopcontrols extension,
`raise_exception`, `strftime_now` and an HF-compatible `tojson` filter.

A template is code from a model file, so rendering is bounded: at most RENDER_TIMEOUT_S of
wall time, `max_chars` of output (string/list repetition is checked before it allocates,
and the sandbox caps `range`) and RENDER_MEMORY_BYTES of address space on the main thread, and
whatever the template raises becomes one ModelFormatError.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any, NoReturn

from spinkv.errors import InvalidInputError, ModelFormatError, one_line
from spinkv.models.info import read_json

# Used for models that ship no template (base models): plain ChatML.
CHATML_ORIGIN = "chatml-default"
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


RENDER_TIMEOUT_S = 5.0
RENDER_MEMORY_BYTES = 512 << 20
"""Address space a render may add (main thread, Linux): a single string operation (`'%9999999999s'
% x`, a `~` or `replace` that doubles a string thirty times) allocates before any size check
can see it, and the alarm cannot interrupt it."""
DEFAULT_MAX_CHARS = 16 << 20
"""Output bound when the caller gives none (real templates render a few KiB)."""


class TemplateError(InvalidInputError):
    """The template refused the conversation (its own `raise_exception`)."""


class _RenderLimit(Exception):
    """Rendering went over its time or size bound."""


def _raise_exception(message: str) -> NoReturn:
    raise TemplateError(f"chat template: {message}")


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: Any = None,
    sort_keys: bool = False,
) -> str:
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _environment() -> Any:
    from jinja2 import nodes
    from jinja2.ext import Extension, loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class GenerationTag(Extension):
        """`{% generation %}...{% endgeneration %}` (HF assistant masks): renders its body."""

        tags = {"generation"}  # noqa: RUF012

        def parse(self, parser: Any) -> Any:
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            call = self.call_method("_render_body")
            return nodes.CallBlock(call, [], [], body).set_lineno(lineno)

        def _render_body(self, caller: Any) -> str:
            return str(caller())

    class BoundedEnvironment(ImmutableSandboxedEnvironment):
        """The sandbox, plus a size check on `*` and `**` before they allocate."""

        intercepted_binops = frozenset(["*", "**"])

        def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
            if operator == "*":
                for seq, count in ((left, right), (right, left)):
                    if (
                        isinstance(seq, (str, list, tuple))
                        and isinstance(count, int)
                        and len(seq) * count > DEFAULT_MAX_CHARS
                    ):
                        raise _RenderLimit(f"'*' makes {len(seq) * count:,} items")
            if operator == "**" and isinstance(right, (int, float)) and abs(right) > 1024:
                raise _RenderLimit(f"'**' with exponent {right}")
            return super().call_binop(context, operator, left, right)

    env = BoundedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[GenerationTag, loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


class ChatTemplate:
    """A compiled chat template with the model's special tokens."""

    def __init__(
        self,
        source: str,
        *,
        bos_token: str | None = None,
        eos_token: str | None = None,
        origin: str = "model",
    ) -> None:
        from jinja2 import TemplateError as JinjaError

        self.source = source
        self.origin = origin
        self.bos_token = bos_token or ""
        self.eos_token = eos_token or ""
        # Compiling evaluates constant expressions (`'%1500000000s' % 'x'` is a 1.5 GB string
        # built here, not in `render`), so it runs under the same bounds.
        try:
            with _alarm(RENDER_TIMEOUT_S), _address_space_bound(RENDER_MEMORY_BYTES):
                self._template = _environment().from_string(source)
        except JinjaError as exc:
            raise ModelFormatError(f"chat template ({origin}) does not compile: {exc}") from exc
        except (_RenderLimit, MemoryError, RecursionError) as exc:
            raise ModelFormatError(
                f"chat template ({origin}) does not compile: {type(exc).__name__}: "
                f"{one_line(exc) or 'out of its memory bound'}"
            ) from None

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        add_generation_prompt: bool = True,
        *,
        max_chars: int = DEFAULT_MAX_CHARS,
        **variables: Any,
    ) -> str:
        """The prompt text for messages ([{"role": ..., "content": ...}, ...]); output
        beyond max_chars (text that could not fit the context anyway) is an error."""
        for m in messages:
            if not isinstance(m, Mapping) or not isinstance(m.get("role"), str):
                raise InvalidInputError(f"chat message without a role: {m!r}")
        context = {
            "bos_token": self.bos_token,
            "eos_token": self.eos_token,
            **variables,
            "messages": [dict(m) for m in messages],
            "add_generation_prompt": add_generation_prompt,
        }
        pieces: list[str] = []
        size = 0
        deadline = time.monotonic() + RENDER_TIMEOUT_S
        try:
            with _alarm(RENDER_TIMEOUT_S), _address_space_bound(RENDER_MEMORY_BYTES):
                for piece in self._template.generate(**context):
                    size += len(piece)
                    if size > max_chars:
                        raise _RenderLimit(f"its output passed {max_chars:,} characters")
                    if time.monotonic() > deadline:
                        raise _RenderLimit(f"it ran for more than {RENDER_TIMEOUT_S:g} s")
                    pieces.append(piece)
        except TemplateError:
            raise
        except _RenderLimit as exc:
            raise InvalidInputError(f"chat template ({self.origin}) stopped: {exc}") from None
        except (Exception, RecursionError, MemoryError) as exc:  # the template is code
            detail = one_line(exc)
            raise ModelFormatError(
                f"chat template ({self.origin}) failed: {type(exc).__name__}: {detail}"
            ) from None
        return "".join(pieces)


@contextmanager
def _alarm(seconds: float) -> Iterator[None]:
    """SIGALRM after seconds, raised as _RenderLimit: bounds a template loop that produces
    no output (chunk checks cannot see it). Only the main thread can take signals; elsewhere
    the chunk-by-chunk checks are the bound."""
    usable = hasattr(signal, "setitimer") and threading.current_thread() is threading.main_thread()
    if not usable:
        yield
        return

    def expire(signum: int, frame: Any) -> None:
        raise _RenderLimit(f"it ran for more than {seconds:g} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


@contextmanager
def _address_space_bound(extra: int) -> Iterator[None]:
    """Lowers the process's address-space limit to what it uses now plus extra bytes, and
    restores it after: an allocation past it is a MemoryError inside the render instead of
    gigabytes taken from the machine. Like the alarm, only on the main thread (the limit is
    the whole process's), and only where the kernel reports the address space in use."""
    try:
        import resource

        page = os.sysconf("SC_PAGE_SIZE")
        with open("/proc/self/statm") as statm:
            used = int(statm.read().split()[0]) * page
    except (ImportError, OSError, ValueError, IndexError):
        yield
        return
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    limit = used + extra
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    if soft != resource.RLIM_INFINITY and soft <= limit:
        yield  # already bounded at least as tightly
        return
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def read_template_source(model_dir: Path) -> tuple[str, str] | None:
    """(template text, where it came from) of a model directory, or None if it has none."""
    model_dir = Path(model_dir)
    config_path = model_dir / "tokenizer_config.json"
    if config_path.is_file():
        template = read_json(config_path).get("chat_template")
        if isinstance(template, list):
            named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
            template = named.get("default") or next(iter(named.values()), None)
        if isinstance(template, str) and template.strip():
            return template, "tokenizer_config.json"
    jinja_path = model_dir / "chat_template.jinja"
    if jinja_path.is_file():
        try:
            return jinja_path.read_text(encoding="utf-8"), "chat_template.jinja"
        except (OSError, UnicodeDecodeError) as exc:
            raise ModelFormatError(f"cannot read {jinja_path}: {exc}") from None
    return None


def load_chat_template(model_dir: Path, fallback: bool = True) -> ChatTemplate | None:
    """The model's chat template (bos/eos tokens from tokenizer_config.json). A model without
    one gets plain ChatML (origin "chatml-default") if fallback, else None."""
    model_dir = Path(model_dir)
    config_path = model_dir / "tokenizer_config.json"
    config = read_json(config_path) if config_path.is_file() else {}

    def token(key: str) -> str | None:
        value = config.get(key)
        if isinstance(value, dict):
            value = value.get("content")
        return value if isinstance(value, str) else None

    found = read_template_source(model_dir)
    if found is None and not fallback:
        return None
    source, origin = found if found else (CHATML_TEMPLATE, CHATML_ORIGIN)
    return ChatTemplate(
        source, bos_token=token("bos_token"), eos_token=token("eos_token"), origin=origin
    )
