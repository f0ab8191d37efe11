"""The public Python API: load a model, generate or stream replies, chat with a kept cache.

import spinkv
model = spinkv.load()                       # the default model (SmolLM2-135M-Instruct)
print(model.generate("What is the capital of France?").text)
for piece in model.stream("Tell me a joke", sampling=spinkv.SamplingParams(temperature=0.7)):
    print(piece, end="", flush=True)
chat = model.chat()
for piece in chat.send("Hi!"):
    print(piece, end="")
logits = model.logits(model.tokenize("Hello world"))   # np.ndarray [T, vocab], float32
"""

from __future__ import annotations

import contextlib
import functools
import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict, Union

import numpy as np

from spinkv import _native
from spinkv.chat_template import CHATML_ORIGIN, ChatTemplate, load_chat_template
from spinkv.context_window import first_fitting, prompt_budget, turn_starts
from spinkv.errors import (
    ChatBusyError,
    ContextOverflowError,
    InvalidInputError,
    SessionPagesError,
    UnsupportedError,
)
from spinkv.generation import (
    GenerationResult,
    TextStream,
    TurnSpec,
    common_prefix_length,
)
from spinkv.kv.options import DEFAULT_KV_PRESET, KvSpec, kv_dict
from spinkv.sampling import SamplingParams
from spinkv.timing import GenerationTimings
from spinkv.tokenizer import Tokenizer, load_tokenizer, valid_text
from spinkv.util.progress import ImportLog, reporting

if TYPE_CHECKING:
    from spinkv.sessions.store import Transcript


class ChatMessage(TypedDict):
    role: str
    content: str


Prompt = Union[str, Sequence[ChatMessage]]

DEFAULT_MAX_TOKENS = 512
RESERVED_TOKENS = 256
"""Cache pages a chat reserves up front (the pools then grow geometrically)."""
ASK_WAIT_S = 600.0
"""How long `ChatSession.ask` waits for another thread's turn on the same chat."""


def load(model: str | Path | None = None, *, threads: int | None = None) -> LoadedModel:
    """Load a model: a local HF-layout directory, a name in the model store, an HF repo id,
    or None for the default model (imported into the store on first use).

    threads sets the runtime's thread count for the whole process (default: all cores).
    """
    from spinkv.models.store import resolve_model

    if threads is not None:
        if isinstance(threads, bool) or not isinstance(threads, int) or not 1 <= threads <= 1024:
            raise InvalidInputError(f"invalid threads {threads!r}: must be an integer in 1..1024")
        _native.set_threads(threads)
    with reporting(ImportLog()) as imports:
        path = resolve_model(None if model is None else str(model))
    started = time.perf_counter()
    tokenizer = load_tokenizer(path)
    chat_template = load_chat_template(path)
    native_model = _native.Model.load(str(path))
    load_ms = (time.perf_counter() - started) * 1000.0
    name = path.name if model is None or Path(str(model)).expanduser().exists() else str(model)
    loaded = LoadedModel(native_model, tokenizer, chat_template, Path(path), load_ms, name=name)
    loaded.import_ms = imports.seconds * 1000.0
    return loaded


class LoadedModel:
    """A model in memory with its tokenizer and chat template. Cheap to share: every
    generation or chat gets its own native session (KV cache)."""

    def __init__(
        self,
        native_model: _native.Model,
        tokenizer: Tokenizer,
        chat_template: ChatTemplate | None,
        path: Path,
        load_ms: float,
        *,
        name: str | None = None,
    ) -> None:
        self.native = native_model
        self.name = name or path.name
        self.tokenizer = tokenizer
        self.chat_template = chat_template
        self.path = path
        self.load_ms = load_ms
        self.import_ms = 0.0  # time load() spent adding the model to the store
        self.config: dict[str, Any] = dict(native_model.config)
        self.max_context: int = int(self.config["max_context"])
        self.vocab_size: int = int(self.config["vocab_size"])

    @property
    def info(self) -> dict[str, Any]:
        """The runtime's view of the model: shapes, dtype, parameters, context, EOS ids."""
        return {
            "name": self.name,
            "path": str(self.path),
            **self.config,
            "eos_token_ids": sorted(self.tokenizer.eos_token_ids),
            "chat_template": None if self.chat_template is None else self.chat_template.origin,
            "isa": _native.isa(),
            "threads": _native.threads(),
        }

    # ---- text <-> tokens -------------------------------------------------------------

    def tokenize(self, text: str, *, add_special_tokens: bool = False) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=add_special_tokens)

    def detokenize(self, token_ids: Iterable[int], *, skip_special_tokens: bool = True) -> str:
        return self.tokenizer.decode(list(token_ids), skip_special_tokens=skip_special_tokens)

    @property
    def has_own_chat_template(self) -> bool:
        """Whether the model ships a chat template (base models get a ChatML fallback, which
        they were not trained on: prompt them with raw text)."""
        return self.chat_template is not None and self.chat_template.origin != CHATML_ORIGIN

    def render_chat(
        self, messages: Sequence[ChatMessage], *, add_generation_prompt: bool = True
    ) -> str:
        """The conversation as the model sees it, through its chat template."""
        if self.chat_template is None:
            raise UnsupportedError(f"{self.path.name} has no chat template: use raw prompts")
        return self.chat_template.render(
            messages,
            add_generation_prompt=add_generation_prompt,
            max_chars=self.tokenizer.max_chars_for(self.max_context),
        )

    def prompt_token_ids(
        self, prompt: Prompt, *, system: str | None = None, raw: bool = False
    ) -> list[int]:
        """Token ids for a prompt: a user message (with optional system message) or a list
        of messages, through the chat template; raw=True tokenizes a string as it is."""
        limit = self.tokenizer.max_chars_for(self.max_context)
        texts = [prompt] if isinstance(prompt, str) else []
        texts += [system] if isinstance(system, str) else []
        size = sum(len(text) for text in texts)
        if size > limit:
            raise ContextOverflowError(
                f"the prompt is {size:,} characters: more than the context of "
                f"{self.max_context} tokens can hold"
            )
        if raw:
            if not isinstance(prompt, str):
                raise InvalidInputError("raw=True takes a string prompt, not messages")
            return self.tokenize(prompt, add_special_tokens=True)
        return self.tokenize(self.render_chat(_messages(prompt, system)))

    # ---- sessions and generation -----------------------------------------------------

    def session(self, kv: KvSpec = None) -> _native.Session:
        """A fresh native session (its own KV cache), for callers that drive the runtime."""
        return self.native.session(kv_dict(kv))

    def context_limit(self, kv: KvSpec = None) -> int:
        options = kv_dict(kv) or {}
        return int(options.get("max_context") or self.max_context)

    @functools.cached_property
    def identity_extra(self) -> dict[str, str]:
        """The cache identity inputs the runtime cannot compute: tokenizer and chat-template
        hashes (the runtime adds the model's content hash, cache policy and build)."""
        from spinkv.sessions.store import chat_template_hash, tokenizer_hash

        return {
            "tokenizer_hash": tokenizer_hash(self.path, self.tokenizer),
            "chat_template_hash": chat_template_hash(self.chat_template),
        }

    def stream(
        self,
        prompt: Prompt,
        *,
        system: str | None = None,
        max_tokens: int = DEFAULT_MAX_TOKENS,
        sampling: SamplingParams | None = None,
        kv: KvSpec = None,
        raw: bool = False,
        session: _native.Session | None = None,
    ) -> TextStream:
        """Start one reply; iterate for text pieces, then read `.result` (text, token
        counts, finish_reason, timings). `session` continues an existing native session
        (e.g. one restored from a prompt cache): its tokens that prefix the prompt are
        reused; it must have been made with the same `kv`."""
        started = time.perf_counter()
        prompt_ids = self.prompt_token_ids(prompt, system=system, raw=raw)
        timings = self.new_timings(tokenize_ms=(time.perf_counter() - started) * 1000.0)
        spec = self.turn_spec(prompt_ids, sampling, max_tokens, kv, timings)
        return TextStream(self.session(kv) if session is None else session, spec)

    def generate(
        self,
        prompt: Prompt,
        *,
        system: str | None = None,
        max_tokens: int = DEFAULT_MAX_TOKENS,
        sampling: SamplingParams | None = None,
        kv: KvSpec = None,
        raw: bool = False,
    ) -> GenerationResult:
        """One complete reply."""
        stream = self.stream(
            prompt, system=system, max_tokens=max_tokens, sampling=sampling, kv=kv, raw=raw
        )
        return stream.read_all()

    def chat(
        self,
        system: str | None = None,
        *,
        kv: KvSpec = None,
        sampling: SamplingParams | None = None,
        max_tokens: int = DEFAULT_MAX_TOKENS,
    ) -> ChatSession:
        """A conversation whose KV cache is kept between turns."""
        return ChatSession(self, system=system, kv=kv, sampling=sampling, max_tokens=max_tokens)

    def logits(self, token_ids: Sequence[int], *, kv: KvSpec = None) -> np.ndarray:
        """Logits after every position of token_ids: float32 array [T, vocab]. The runtime
        checks the ids (InvalidInputError) and the context (ContextOverflowError)."""
        logits = self.session(kv).prefill(token_ids, True)
        return np.asarray(logits, dtype=np.float32)

    # ---- helpers shared with ChatSession ---------------------------------------------

    def new_timings(self, tokenize_ms: float = 0.0) -> GenerationTimings:
        return GenerationTimings(
            load_ms=self.load_ms,
            import_ms=self.import_ms,
            tokenize_ms=tokenize_ms,
            isa=_native.isa(),
            threads=_native.threads(),
        )

    def turn_spec(
        self,
        prompt_ids: list[int],
        sampling: SamplingParams | None,
        max_tokens: int,
        kv: KvSpec,
        timings: GenerationTimings,
        slide: bool = False,
    ) -> TurnSpec:
        return TurnSpec(
            prompt_ids=prompt_ids,
            sampling=sampling or SamplingParams(),
            max_tokens=max_tokens,
            eos_ids=self.tokenizer.eos_token_ids,
            max_context=self.context_limit(kv),
            tokenizer=self.tokenizer,
            timings=timings,
            slide=slide,
        )


@dataclass
class RestoreOutcome:
    """What `ChatSession.restore` did with the saved KV cache.

    messages: the transcript's messages (without the system prompt); context_start: the first
    of them the cache holds or, after a refused cache, the next turn re-reads (beyond 0 when
    the conversation is longer than the context of a sliding chat). After a refused cache in a
    sliding chat, prompt_budget is the most tokens the rebuilt prompt may take (the context
    less the reply's room) and system_tokens the system prompt's alone, as the template
    renders it (0 otherwise).
    """

    reused: bool
    cached_tokens: int
    reason: str | None = None
    fields: list[str] = field(default_factory=list)
    turns: int = 0
    messages: int = 0
    context_start: int = 0
    prompt_budget: int = 0
    system_tokens: int = 0

    @property
    def system_overflows(self) -> bool:
        """Whether the system prompt alone is over the prompt budget: then no message fits
        beside it, whatever their length."""
        return self.system_tokens > self.prompt_budget


def _messages(prompt: Prompt, system: str | None) -> list[ChatMessage]:
    if isinstance(prompt, str):
        messages: list[ChatMessage] = [{"role": "user", "content": valid_text(prompt)}]
    elif isinstance(prompt, Sequence) and not isinstance(prompt, (bytes, bytearray)):
        messages = [_checked_message(m) for m in prompt]
    else:
        raise InvalidInputError(
            f"prompt must be a string or a list of messages, not {type(prompt).__name__}"
        )
    if system is not None:
        system = valid_text(system, "system prompt")
        if messages and messages[0]["role"] == "system":
            raise InvalidInputError("system given twice: as an argument and as the first message")
        messages.insert(0, {"role": "system", "content": system})
    if not messages:
        raise InvalidInputError("no messages given")
    return messages


def _checked_message(message: Mapping[str, Any]) -> ChatMessage:
    if not isinstance(message, Mapping):
        raise InvalidInputError(f"a message must be a mapping, not {type(message).__name__}")
    role, content = message.get("role"), message.get("content")
    if not isinstance(role, str) or not isinstance(content, str):
        raise InvalidInputError(f"a message needs string 'role' and 'content': {message!r}")
    return {"role": valid_text(role), "content": valid_text(content)}


class ChatSession:
    """A conversation that keeps its native session (KV cache) between turns.

    Each turn renders the conversation with the chat template — the system prompt and the
    history from `context_start` on (0, the whole history, unless a sliding chat rebuilt its
    cache from a long conversation: see Lifecycle) — keeps the cached tokens that are a prefix
    of the new rendering and prefills only the rest: normally the end-of-reply marker and the
    new user turn. Where the reply's text tokenizes differently from the sampled tokens, or
    the system prompt changed, the cache is cut back to the common prefix, so the cache always
    matches what was rendered.

    An interrupted reply (Ctrl-C, or the stream closed early) keeps the text streamed so far
    as the assistant message, like ollama; if nothing was streamed the user turn is dropped.
    Either way, and after a runtime error (which drops the turn), the cache is rolled back to
    exactly what it was before the turn; the next turn prefills what it lacks.

    Lifecycle: the cache reserves pages up front and grows geometrically; with `slide` (the
    default, when the context holds at least two pages) a full cache retires its oldest
    pages after the first one (an attention sink) instead of refusing the turn; `clear()`
    resets it and gives back memory beyond the reservation. `save(path)` / `restore(path)`
    write and read session files (spinkv.sessions.store handles names, locking, atomic writes).

    Long conversations: when a sliding chat must build its cache from nothing (after a
    refused restore, or when a changed system prompt leaves little of the cache: its start
    slid out, or the prompt's new part is longer than that budget) and
    the rendering is longer than the context minus room for the reply (max_tokens, at most a
    quarter of the context), it feeds the system prompt and only the newest whole turns that
    fit, and moves `context_start` to the first of them, so later renderings extend what the
    cache holds and reuse it. A start chosen by `restore` (reported in its outcome) is kept
    for the next turn unless that prompt outgrows the whole context. The history, `history`,
    `messages` and saved transcripts always hold the whole conversation; a transcript records
    `context_start` so a reused cache goes on from the same message. A chat that does not
    slide refuses a conversation longer than its context (ContextOverflowError), as before.

    Threads: one turn runs at a time. `ask` from several threads takes turns (waiting up to
    ASK_WAIT_S); `send`, `clear`, `set_system`, `save` and `restore` while another thread's
    reply is streaming raise ChatBusyError. Give each thread its own chat for parallel work.
    """

    def __init__(
        self,
        model: LoadedModel,
        *,
        system: str | None = None,
        kv: KvSpec = None,
        sampling: SamplingParams | None = None,
        max_tokens: int = DEFAULT_MAX_TOKENS,
        slide: bool = True,
    ) -> None:
        self.model = model
        self.kv = kv_dict(kv)
        self.sampling = sampling or SamplingParams()
        self.max_tokens = max_tokens
        self.system = None if system is None else valid_text(system, "system prompt")
        self.created: str | None = None
        self._history: list[ChatMessage] = []
        self._start = 0  # the first message of _history that turns render (see Lifecycle)
        self._start_chosen = False  # chosen by restore() for the next turn
        self._session = model.session(self.kv)
        self.limit = model.context_limit(self.kv)
        self._check_system(self.system)
        self.slide = slide and self._enable_sliding()
        self._session.reserve(min(self.limit, RESERVED_TOKENS))
        self._active: TextStream | None = None
        self._active_thread: int | None = None
        self._turn = threading.Lock()  # held from send() until that reply ends
        self.last_result: GenerationResult | None = None

    def _enable_sliding(self) -> bool:
        try:
            self._session.set_sliding(True)
        except _native.InvalidInputError:  # the context is shorter than two pages
            return False
        return True

    @property
    def history(self) -> list[ChatMessage]:
        """The user and assistant turns so far (a copy; the system prompt is `.system`)."""
        return [dict(m) for m in self._history]  # type: ignore[misc]

    @property
    def messages(self) -> list[ChatMessage]:
        """The whole conversation: the system message (if set) and the history (turns render
        the history from `context_start` on)."""
        return self._system_head() + self.history

    @property
    def context_start(self) -> int:
        """Index in `history` of the first message the cache was fed (0: all of them)."""
        return self._start

    def _system_head(self) -> list[ChatMessage]:
        return [] if self.system is None else [{"role": "system", "content": self.system}]

    @property
    def session(self) -> _native.Session:
        """The native session: this conversation's tokens and KV cache."""
        return self._session

    @property
    def cached_tokens(self) -> int:
        """Tokens in the KV cache (fewer than the conversation after a sliding window)."""
        return int(self._session.cache_len)

    def send(
        self,
        text: str,
        *,
        sampling: SamplingParams | None = None,
        max_tokens: int | None = None,
    ) -> TextStream:
        """Add a user turn and start the reply; iterate the stream for text pieces."""
        self._claim(wait_s=0.0)
        try:
            return self._start_turn(text, sampling=sampling, max_tokens=max_tokens)
        except BaseException:
            self._turn.release()
            raise

    def _claim(self, wait_s: float) -> None:
        """Take the turn lock (closing this thread's own unfinished reply first)."""
        if self._active is not None and self._active_thread == threading.get_ident():
            self._close_active()
        acquired = self._turn.acquire(timeout=wait_s) if wait_s > 0 else self._turn.acquire(False)
        if not acquired:
            raise ChatBusyError(
                "this chat is answering in another thread: a ChatSession runs one turn at a "
                "time (use ask() to take turns, or one model.chat() per thread)"
            )

    @contextlib.contextmanager
    def _exclusive(self) -> Iterator[None]:
        self._claim(wait_s=0.0)
        try:
            yield
        finally:
            self._turn.release()

    def _start_turn(
        self,
        text: str,
        *,
        sampling: SamplingParams | None = None,
        max_tokens: int | None = None,
    ) -> TextStream:
        started = time.perf_counter()
        text = valid_text(text, "message")
        user: ChatMessage = {"role": "user", "content": text}
        max_tokens = self.max_tokens if max_tokens is None else max_tokens
        if self.slide:
            self._check_fits_alone(text)
        start, prompt_ids = self._turn_prompt(user, max_tokens)
        timings = self.model.new_timings(tokenize_ms=(time.perf_counter() - started) * 1000.0)
        spec = self.model.turn_spec(
            prompt_ids, sampling or self.sampling, max_tokens, self.kv, timings, slide=self.slide
        )

        def record(result: GenerationResult) -> None:
            self.last_result = result
            if result.finish_reason != "interrupted" or result.text:
                self._history.append(user)
                self._history.append({"role": "assistant", "content": result.text})
            if result.finish_reason != "interrupted":  # else the cache is as before the turn
                self._start, self._start_chosen = start, False
            self._end_turn()

        try:
            self._active = TextStream(
                self._session, spec, on_finish=record, on_failure=self._end_turn
            )
            self._active_thread = threading.get_ident()
            return self._active
        except BaseException:  # e.g. Ctrl-C before the caller got the stream
            self._session.rollback_turn()
            raise

    def _check_fits_alone(self, text: str) -> None:
        """Earlier turns slide out of the window; the new message itself, and the system
        prompt that never slides out, must fit."""
        size = len(self.model.tokenize(text))
        if self.system:
            size += len(self.model.tokenize(self.system))
        if size > self.limit:
            what = "the system prompt and the message are" if self.system else "the message is"
            raise ContextOverflowError(
                f"{what} {size} tokens but the context holds {self.limit} tokens"
            )

    def _render_from(self, start: int, user: ChatMessage | None) -> list[int]:
        """Token ids of the system prompt, the history from `start` on and `user` (with the
        generation prompt); without `user`, of the conversation as it stands."""
        messages = self._system_head() + self._history[start:] + ([user] if user else [])
        if not messages:
            return []
        rendered = self.model.render_chat(messages, add_generation_prompt=user is not None)
        return self.model.tokenize(rendered)

    def _turn_prompt(self, user: ChatMessage, max_tokens: object) -> tuple[int, list[int]]:
        """Where this turn's rendering starts in the history, and its token ids: from
        `context_start`, or later when the cache is built from nothing and that is too long."""
        prompt_ids = self._render_from(self._start, user)
        budget = prompt_budget(self.limit, max_tokens)
        cap = self.limit if self._start_chosen else budget
        if not self.slide or len(prompt_ids) <= cap or not self._rebuilds(prompt_ids, cap):
            return self._start, prompt_ids
        start = self._fitting_start(user, budget, self._start)
        return start, self._render_from(start, user)

    def _rebuilds(self, prompt_ids: Sequence[int], cap: int) -> bool:
        """Whether the cache keeps nothing of use for this prompt: it is empty, the prompt
        leaves it before its retired tokens (the cut then keeps only the head), or what the
        prompt does not share with it is more than `cap` tokens (a changed system prompt)."""
        if len(self._session) == 0:
            return True
        common = common_prefix_length(self._session.tokens, prompt_ids)
        retired = int(self._session.retired)
        return (retired > 0 and common < retired) or len(prompt_ids) - common > cap

    def _fitting_start(self, user: ChatMessage | None, budget: int, first: int) -> int:
        """The earliest start from `first` on whose rendering has at most `budget` tokens
        (the end of the history when none has)."""

        def fits(start: int) -> bool:
            try:
                return len(self._render_from(start, user)) <= budget
            except InvalidInputError:  # past the template's output bound: far too long
                return False

        return first_fitting(turn_starts(self._history, first), fits)

    def _end_turn(self) -> None:
        self._active_thread = None
        if self._turn.locked():
            self._turn.release()

    def cancel(self) -> None:
        """Stop the reply in progress, if any: the cache returns to where its turn started.
        Call it after a KeyboardInterrupt that may have hit before `send` returned."""
        with self._exclusive():
            self._session.rollback_turn()

    def ask(self, text: str, **options: Any) -> GenerationResult:
        """send() and wait for the whole reply (another thread's turn first, if any)."""
        self._claim(wait_s=ASK_WAIT_S)
        try:
            stream = self._start_turn(text, **options)
        except BaseException:
            self._turn.release()
            raise
        return stream.read_all()

    def clear(self) -> None:
        """Forget the conversation (the system prompt stays), empty the cache and give back
        its pages beyond the reservation: the chat is then as good as a new one."""
        with self._exclusive():
            self._history.clear()
            self._start, self._start_chosen = 0, False
            self._session.reset()
            self._session.trim_memory()

    def set_system(self, system: str | None) -> None:
        """Change the system prompt (None: the template's default). The history stays; the
        next turn recomputes the cache from the first token that changed."""
        if system is not None:
            system = valid_text(system, "system prompt")
            self._check_system(system)
        with self._exclusive():
            self.system = system

    def _check_system(self, system: str | None) -> None:
        """A system prompt the context cannot hold with room for a reply is refused at once
        (it never slides out: every turn would fail on it)."""
        if system is None:
            return
        size = len(self.model.tokenize(system))
        if size >= self.limit:
            raise ContextOverflowError(
                f"the system prompt is {size} tokens but the context holds {self.limit} tokens"
            )

    def stats(self) -> dict[str, Any]:
        """KV cache statistics from the runtime, plus the conversation's size."""
        return {
            "turns": len(self._history) // 2,
            "cached_tokens": self.cached_tokens,
            "retired_tokens": int(self._session.retired),
            "max_context": self.model.context_limit(self.kv),
            "sliding_window": self.slide,
            "context_start": self._start,
            "cache": dict(self._session.cache_stats()),
        }

    # ---- session files ----------------------------------------------------------------

    def transcript(self) -> Transcript:
        """The conversation as a session file records it."""
        from spinkv.sessions.store import Transcript, now_iso

        return Transcript(
            messages=self.history,  # type: ignore[arg-type]
            system=self.system,
            model={"name": self.model.name, "path": str(self.model.path)},
            kv=self.kv or {"preset": DEFAULT_KV_PRESET},
            sampling=self.sampling.to_dict(),
            max_tokens=self.max_tokens,
            created=self.created or now_iso(),
            updated=now_iso(),
            context_start=self._start,
        )

    def save(self, path: str | Path) -> int:
        """Write the conversation and its KV pages to path (replacing it; not atomic by
        itself: spinkv.sessions.store.save_chat is). Returns the bytes written."""
        with self._exclusive():
            transcript = self.transcript()
            self.created = transcript.created
            extra = self.model.identity_extra
            return int(self._session.save(str(path), transcript.to_json(), extra))

    def restore(self, path: str | Path, *, system: str | None = None) -> RestoreOutcome:
        """Replace this conversation with the one saved at path. Its KV pages are reused
        when their identity matches this chat's model, tokenizer, template, cache policy and
        runtime and every page checks out; otherwise the cache is refused (`outcome.reason`
        says why, `outcome.fields` names differing identity fields) and the next turn
        re-prefills the transcript — a sliding chat only the system prompt and the newest
        turns that fit when the transcript is longer than that (`outcome.context_start`).
        system: a system prompt to go on with instead of the saved one (the turns that fit
        are chosen beside it). Raises if the file itself is unreadable or `system` does not
        fit the context (this chat is then untouched)."""
        from spinkv.sessions.store import read_transcript

        if system is not None:
            system = valid_text(system, "system prompt")
            self._check_system(system)
        with self._exclusive():
            transcript, _ = read_transcript(Path(path))
            try:
                self._session.load(str(path), self.model.identity_extra)
                outcome = RestoreOutcome(True, self.cached_tokens)
            except _native.IdentityMismatchError as exc:
                outcome = RestoreOutcome(False, 0, str(exc), list(getattr(exc, "fields", [])))
            except (_native.SessionPagesError, SessionPagesError) as exc:
                outcome = RestoreOutcome(False, 0, str(exc))
            if not outcome.reused:
                self._session.reset()
            self._history = [
                {"role": m["role"], "content": m["content"]} for m in transcript.messages
            ]
            self.system = transcript.system if system is None else system
            self.created = transcript.created or None
            self._start, self._start_chosen = self._restored_start(outcome, transcript), True
            outcome.turns = transcript.turns
            outcome.messages, outcome.context_start = len(self._history), self._start
            return outcome

    def _restored_start(self, outcome: RestoreOutcome, transcript: Transcript) -> int:
        """A reused cache goes on from the message it was fed from; a refused one is rebuilt
        from the newest turns that fit (a sliding chat) or from the start."""
        if outcome.reused:
            return transcript.context_start
        if not self.slide:
            return 0
        outcome.prompt_budget = prompt_budget(self.limit, self.max_tokens)
        outcome.system_tokens = self._rendered_system_tokens()
        return self._fitting_start(None, outcome.prompt_budget, 0)

    def _rendered_system_tokens(self) -> int:
        """Tokens of the system prompt as the template renders it with no message (0 without
        one)."""
        try:
            return len(self._render_from(len(self._history), None))
        except InvalidInputError:  # past the template's output bound: count the text alone
            return len(self.model.tokenize(self.system or ""))

    def _close_active(self) -> None:
        if self._active is not None and not self._active.finished:
            self._active.close()
        self._active = None
