"""One reply on a native session: prefix reuse, chunked prefill, the decode loop, streaming.

`TextStream` drives the runtime; which cached tokens a prompt keeps is the runtime's rule
(`Session.reuse_prefix`).
"""

from __future__ import annotations

from collections.abc import Generator, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Literal

from spinkv import _native
from spinkv.errors import ContextOverflowError, InvalidInputError
from spinkv.sampling import SamplingParams
from spinkv.timing import GenerationTimings, Stopwatch

if TYPE_CHECKING:
    from spinkv.tokenizer import StreamDecoder, Tokenizer

FinishReason = Literal["stop", "length", "interrupted", "context"]

PREFILL_BLOCK_TOKENS: int = _native.PREFILL_BLOCK_TOKENS
"""Prompt tokens per native prefill call (the runtime's forward block, so each call streams
the weights once): Ctrl-C is noticed between blocks."""


def common_prefix_length(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def chunked(tokens: Sequence[int], size: int) -> Iterator[list[int]]:
    if size <= 0:
        raise ValueError("chunk size must be positive")
    for start in range(0, len(tokens), size):
        yield list(tokens[start : start + size])


@dataclass
class GenerationResult:
    """One finished (or interrupted) reply.

    cached_tokens: prompt tokens whose KV entries were reused from the cache. In a sliding
    chat, tokens that slid out of the cache earlier are neither reused nor computed again, so
    prompt_tokens = retired + cached_tokens + timings.prefill_tokens there.
    """

    text: str
    token_ids: list[int]
    prompt_tokens: int
    cached_tokens: int
    finish_reason: FinishReason
    timings: GenerationTimings

    @property
    def completion_tokens(self) -> int:
        return len(self.token_ids)

    def to_dict(self) -> dict[str, Any]:
        return {
            "text": self.text,
            "prompt_tokens": self.prompt_tokens,
            "cached_tokens": self.cached_tokens,
            "completion_tokens": self.completion_tokens,
            "finish_reason": self.finish_reason,
            "timings": self.timings.to_dict(),
        }


@dataclass
class TurnSpec:
    """Everything one reply needs besides the session.

    slide: the session retires old cache pages when full (`Session.set_sliding`), so neither
    the prompt nor the reply is bounded by max_context.
    """

    prompt_ids: list[int]
    sampling: SamplingParams
    max_tokens: int
    eos_ids: frozenset[int]
    max_context: int
    tokenizer: Tokenizer
    timings: GenerationTimings = field(default_factory=GenerationTimings)
    slide: bool = False


class TextStream(Iterator[str]):
    """Iterator over the text pieces of one reply; `.result` once it has ended.

    The prompt is checked and the cache reconciled when the stream is created, before any
    token is computed. Stopping early (`close()`, `break` then `close()`, or Ctrl-C) ends the
    reply with finish_reason "interrupted"; the text streamed so far is the reply.
    `on_finish(result)` runs when a reply ends; `on_failure()` when the runtime raised
    anything other than KeyboardInterrupt.

    The session is checkpointed before the cache is touched. A reply that ends normally keeps
    the turn; an interrupted or failed one rolls the session back to the checkpoint, so the
    cache (tokens, pages, logits) is exactly what it was before the turn, wherever it stopped.
    """

    def __init__(
        self,
        session: _native.Session,
        spec: TurnSpec,
        on_finish: Callable[[GenerationResult], None] | None = None,
        on_failure: Callable[[], None] | None = None,
    ) -> None:
        _check_request(spec)
        self._session = session
        self._spec = spec
        self._on_finish = on_finish
        self._on_failure = on_failure
        self._result: GenerationResult | None = None
        self._failed = False
        self._sampler = spec.sampling.to_native()
        session.checkpoint()
        try:
            # Keeps the longest common prefix, minus the prompt's last token when all of it
            # is cached (its logits must be this prompt's), and less after a retirement.
            session.reuse_prefix(spec.prompt_ids)
        except BaseException:
            session.rollback_turn()
            raise
        # The prompt tokens the session holds by position: in a sliding chat some of them slid
        # out of the cache, so only `_reused` of them were read from it this turn.
        self._fed = len(session)
        self._reused = int(session.cache_len)
        self._pieces = self._run()

    @property
    def result(self) -> GenerationResult:
        if self._result is None:
            raise RuntimeError("the reply has not ended yet: iterate the stream or close() it")
        return self._result

    @property
    def finished(self) -> bool:
        return self._result is not None

    def __iter__(self) -> TextStream:
        return self

    def __next__(self) -> str:
        return next(self._pieces)

    def close(self) -> None:
        self._pieces.close()
        if self._result is None and not self._failed:  # closed before it started
            self._finish("interrupted", self._spec.tokenizer.stream())

    def __enter__(self) -> TextStream:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def read_all(self) -> GenerationResult:
        """Consume the rest of the stream and return the result."""
        for _ in self:
            pass
        return self.result

    def _run(self) -> Generator[str, None, None]:
        spec, session, timings = self._spec, self._session, self._spec.timings
        watch = Stopwatch(timings)
        detokenizer = spec.tokenizer.stream()
        reason: FinishReason = "interrupted"
        failed = True
        session.reset_timings()
        try:
            for chunk in chunked(spec.prompt_ids[self._fed :], PREFILL_BLOCK_TOKENS):
                with watch.phase("prefill_ms"):
                    session.prefill(chunk)
                timings.prefill_tokens += len(chunk)
            while True:
                with watch.phase("sampling_ms"):
                    token = session.sample(self._sampler)
                if timings.first_token_ms is None:
                    timings.first_token_ms = watch.elapsed_ms()
                if token in spec.eos_ids:
                    reason = "stop"
                    break
                piece = detokenizer.push(token)
                if piece:
                    yield piece
                if len(detokenizer.tokens) >= spec.max_tokens:
                    reason = "length"
                    break
                if not spec.slide and len(session) >= spec.max_context:
                    reason = "context"
                    break
                with watch.phase("decode_ms"):
                    session.decode(token)
                timings.decode_tokens += 1
            tail = detokenizer.flush()
            if tail:
                yield tail
            failed = False
        except (KeyboardInterrupt, GeneratorExit):
            failed = False
            raise
        finally:
            if failed:
                self._failed = True
                self._session.rollback_turn()
                if self._on_failure is not None:
                    self._on_failure()
            else:
                self._finish(reason, detokenizer)

    def _finish(self, reason: FinishReason, detokenizer: StreamDecoder) -> None:
        if reason == "interrupted":
            self._session.rollback_turn()
        else:
            self._session.commit_turn()
        timings = self._spec.timings
        timings.add_native_breakdown(self._session.timings())
        self._result = GenerationResult(
            text=detokenizer.text,
            token_ids=list(detokenizer.tokens),
            prompt_tokens=len(self._spec.prompt_ids),
            cached_tokens=self._reused,
            finish_reason=reason,
            timings=timings,
        )
        if self._on_finish is not None:
            self._on_finish(self._result)


def _check_request(spec: TurnSpec) -> None:
    if not spec.prompt_ids:
        raise InvalidInputError("the prompt is empty after tokenization")
    if isinstance(spec.max_tokens, bool) or not isinstance(spec.max_tokens, int):
        raise InvalidInputError(f"invalid max_tokens {spec.max_tokens!r}: must be an integer")
    if spec.max_tokens < 1:
        raise InvalidInputError(f"invalid max_tokens {spec.max_tokens}: must be >= 1")
    if not spec.slide and len(spec.prompt_ids) > spec.max_context:
        raise ContextOverflowError(
            f"the prompt is {len(spec.prompt_ids)} tokens but the context holds "
            f"{spec.max_context} tokens"
        )
