"""Loading a model's tokenizer.json and turning text into token ids and back.

`StreamDecoder` turns a stream of token ids into text pieces as they arrive (a character can
span several byte-level tokens, e.g. an emoji is 4 bytes), through `tokenizers`' DecodeStream.
"""

from __future__ import annotations

import contextlib
import functools
import re
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from spinkv.errors import InvalidInputError, ModelFormatError, ModelNotFoundError
from spinkv.models.info import read_json
from spinkv.util.quiet_panics import is_panic, quiet_call


def valid_text(text: object, what: str = "text") -> str:
    """text as a str that encodes to UTF-8: bytes that were not UTF-8 (argv and stdin
    decode them to lone surrogates) become U+FFFD, as a terminal would show them."""
    if not isinstance(text, str):
        raise InvalidInputError(f"{what} must be a string, not {type(text).__name__}")
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        pass
    # Surrogates outside surrogateescape's range (U+DC80..U+DCFF: the undecodable bytes) come
    # from JSON escapes or other code, not from bytes: they are U+FFFD directly.
    text = _FOREIGN_SURROGATES.sub("\ufffd", text)
    return text.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


_FOREIGN_SURROGATES = re.compile("[\ud800-\udc7f\udd00-\udfff]")


def _token_text(value: Any) -> str | None:
    """A special token as tokenizer_config.json gives it: a string or {"content": ...}."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _as_id_list(value: Any) -> list[int]:
    if value is None:
        return []
    if isinstance(value, int):
        return [value]
    if isinstance(value, (list, tuple)):
        return [int(v) for v in value if isinstance(v, int)]
    return []


class Tokenizer:
    """A `tokenizers.Tokenizer` plus the model's special-token facts."""

    def __init__(
        self,
        tokenizer: Any,
        *,
        bos_token_id: int | None = None,
        eos_token_ids: Iterable[int] = (),
        bos_token: str | None = None,
        eos_token: str | None = None,
    ) -> None:
        self.hf = tokenizer
        self.bos_token_id = bos_token_id
        self.eos_token_ids: frozenset[int] = frozenset(eos_token_ids)
        self.bos_token = bos_token
        self.eos_token = eos_token
        added = tokenizer.get_added_tokens_decoder()
        self.special_ids: frozenset[int] = frozenset(i for i, t in added.items() if t.special)

    @classmethod
    def from_dir(cls, model_dir: Path) -> Tokenizer:
        """Load tokenizer.json, with special tokens from tokenizer_config.json,
        generation_config.json and config.json. Checks that token ids fit the vocab."""
        from tokenizers import Tokenizer as HFTokenizer

        model_dir = Path(model_dir)
        path = model_dir / "tokenizer.json"
        if not path.is_file():
            raise ModelNotFoundError(f"{model_dir} has no tokenizer.json")
        try:
            hf = HFTokenizer.from_file(str(path))
        except Exception as exc:  # tokenizers raises a plain Exception on bad files
            raise ModelFormatError(f"cannot load {path}: {exc}") from exc

        def optional_json(name: str) -> dict[str, Any]:
            p = model_dir / name
            return read_json(p) if p.is_file() else {}

        config = optional_json("config.json")
        generation = optional_json("generation_config.json")
        tok_config = optional_json("tokenizer_config.json")

        bos_token = _token_text(tok_config.get("bos_token"))
        eos_token = _token_text(tok_config.get("eos_token"))
        bos_id = generation.get("bos_token_id", config.get("bos_token_id"))
        if bos_id is None and bos_token is not None:
            bos_id = hf.token_to_id(bos_token)
        eos_ids = _as_id_list(generation.get("eos_token_id")) + _as_id_list(
            config.get("eos_token_id")
        )
        if eos_token is not None and hf.token_to_id(eos_token) is not None:
            eos_ids.append(hf.token_to_id(eos_token))
        size = hf.get_vocab_size(with_added_tokens=True)
        for what, token_id in [("bos_token_id", bos_id)] + [("eos_token_id", i) for i in eos_ids]:
            if token_id is not None and not (isinstance(token_id, int) and 0 <= token_id < size):
                raise ModelFormatError(
                    f"{model_dir}: {what} {token_id!r} is not a token of its {size}-token "
                    "vocabulary (generation_config.json or config.json)"
                )
        if bos_token is None and isinstance(bos_id, int):
            bos_token = hf.id_to_token(bos_id)
        if eos_token is None and eos_ids:
            eos_token = hf.id_to_token(eos_ids[0])
        vocab = config.get("vocab_size")
        if isinstance(vocab, int) and size > vocab:
            raise ModelFormatError(
                f"tokenizer has {size} tokens but config.json vocab_size is {vocab} "
                "(tokenizer and embedding do not match)"
            )
        return cls(
            hf,
            bos_token_id=bos_id if isinstance(bos_id, int) else None,
            eos_token_ids=eos_ids,
            bos_token=bos_token,
            eos_token=eos_token,
        )

    @property
    def vocab_size(self) -> int:
        return int(self.hf.get_vocab_size(with_added_tokens=True))

    @functools.cached_property
    def max_token_chars(self) -> int:
        """The longest token's text: no token covers more characters (byte-level and
        SentencePiece vocabularies spell each token with at least one char per char)."""
        return max((len(token) for token in self.hf.get_vocab(with_added_tokens=True)), default=1)

    def max_chars_for(self, tokens: int) -> int:
        """Characters beyond which a text cannot tokenize into `tokens` tokens (with a 2x
        margin for normalizers): longer prompts are refused before tokenizing them."""
        return 2 * tokens * max(self.max_token_chars, 1) + 1024

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """Token ids of text. Special tokens written in the text (e.g. <|im_start|>) become
        their ids. add_special_tokens adds what the tokenizer's post-processor adds (a BOS
        for some models); chat-template output already holds them, hence the default."""
        text = valid_text(text)
        with _tokenizer_failures("encoding"):
            encoding = quiet_call(self.hf.encode, text, add_special_tokens=add_special_tokens)
        return list(encoding.ids)

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        """Text of token ids; an id outside the vocabulary is an InvalidInputError."""
        checked = []
        for token in ids:
            if isinstance(token, bool) or not isinstance(token, (int, np.integer)):
                raise InvalidInputError(f"token id {token!r} is not an integer")
            if not 0 <= int(token) < self.vocab_size:
                raise InvalidInputError(
                    f"token id {token} is outside the vocabulary (0..{self.vocab_size - 1})"
                )
            checked.append(int(token))
        with _tokenizer_failures("decoding"):
            text = quiet_call(self.hf.decode, checked, skip_special_tokens=skip_special_tokens)
        return str(text)

    def token_to_id(self, token: str) -> int | None:
        return self.hf.token_to_id(token)

    def id_to_token(self, token_id: int) -> str | None:
        return self.hf.id_to_token(token_id)

    def is_eos(self, token_id: int) -> bool:
        return token_id in self.eos_token_ids

    def stream(self, skip_special_tokens: bool = True) -> StreamDecoder:
        return StreamDecoder(self, skip_special_tokens=skip_special_tokens)


@contextlib.contextmanager
def _tokenizer_failures(what: str) -> Iterator[None]:
    """A panic inside `tokenizers` (a model's pre-tokenizer regex that gives up, say) as a
    ModelFormatError: pyo3 raises it as PanicException, a BaseException that no `except
    Exception` catches. The calls that may panic run through `quiet_call`, which keeps the
    panic hook's report ("thread '<unnamed>' panicked at ...") off stderr."""
    try:
        yield
    except BaseException as exc:
        if not is_panic(exc):
            raise
        reason = str(exc).splitlines()[0] if str(exc) else "a panic"
        raise ModelFormatError(f"the model's tokenizer failed while {what}: {reason}") from None


def load_tokenizer(model_dir: Path) -> Tokenizer:
    """The tokenizer of an HF-layout model directory."""
    return Tokenizer.from_dir(model_dir)


class StreamDecoder:
    """Incremental detokenization: push token ids, get the new text each one completes.

    `tokenizers`' DecodeStream does the work (it holds back a partial UTF-8 character and
    re-decodes a few tokens of context for decoders that look at neighbours). The pieces
    concatenate to decode(all tokens) once flush() has been called.
    """

    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool = True) -> None:
        from tokenizers.decoders import DecodeStream

        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.tokens: list[int] = []
        self.text = ""
        self._stream = DecodeStream(skip_special_tokens=skip_special_tokens)

    def push(self, token_id: int) -> str:
        """Add one token; return the text it completes ("" while a character is partial)."""
        self.tokens.append(int(token_id))
        # A panic (a BaseException) passes the `except Exception` to _tokenizer_failures.
        with _tokenizer_failures("decoding"):
            try:
                piece = quiet_call(self._stream.step, self.tokenizer.hf, int(token_id)) or ""
            except Exception as exc:  # tokenizers raises a plain Exception for a bad id
                raise InvalidInputError(f"cannot decode token id {token_id}: {exc}") from None
        self.text += piece
        return piece

    def flush(self) -> str:
        """The text still held back (a trailing partial character decodes as U+FFFD)."""
        full = self.tokenizer.decode(self.tokens, skip_special_tokens=self.skip_special_tokens)
        piece = full[len(self.text) :] if full.startswith(self.text) else ""
        self.text += piece
        return piece
