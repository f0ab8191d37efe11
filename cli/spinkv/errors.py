"""The exception hierarchy of spinkv, defined once.

Every error a user can cause (bad path, bad file, unsupported model, bad argument) is a
subclass of :class:`SpinkvError`; the CLI prints it in one line and exits with 2. The Rust
runtime raises these same classes (``spinkv._native`` looks them up here), so
``except spinkv.SpinkvError`` catches what comes from Rust too. :class:`InternalError` is the
exception: a bug inside spinkv (a caught Rust panic), reported with exit code 1.
"""

from __future__ import annotations

from collections.abc import Sequence


class SpinkvError(Exception):
    """Base class of every error spinkv raises."""


class ModelNotFoundError(SpinkvError):
    """A model could not be located: no such directory, store name, file or cached repo."""


class ModelFormatError(SpinkvError):
    """A model's files exist but are malformed: truncated, corrupted or inconsistent."""


class UnsupportedError(SpinkvError):
    """A well-formed model that spinkv cannot run: architecture, quant type, tokenizer kind."""


class InvalidInputError(SpinkvError):
    """A bad argument or input value (sampling values, prompt too long, bad name, ...)."""


class ContextOverflowError(InvalidInputError):
    """A prompt (or a conversation) longer than the context the session can hold."""


class KvCacheError(SpinkvError):
    """The KV cache refused an operation."""


class SessionFileError(SpinkvError):
    """A session file cannot be read: not a session file, truncated, corrupt, from a newer
    spinkv, or not a regular file."""


class SessionPagesError(SpinkvError):
    """A session file's transcript is intact but its KV pages cannot be used."""


class SessionBusyError(SpinkvError):
    """A session is open for writing in another spinkv process."""


class ChatBusyError(InvalidInputError):
    """A ChatSession was used from a second thread while a turn was running."""


class IdentityMismatchError(SpinkvError):
    """A saved KV cache belongs to another model, tokenizer, template, cache policy or
    runtime; ``fields`` names the identity fields that differ."""

    def __init__(self, message: str = "", fields: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.fields: list[str] = list(fields)


class InternalError(SpinkvError):
    """A bug inside spinkv (a caught Rust panic): never the user's fault; please report it."""


def debug_enabled() -> bool:
    """SPINKV_DEBUG is set (to anything but "", "0", "false" or "no"): errors keep their
    tracebacks and panics their reports (spinkv-py's panic hook reads it the same way)."""
    import os

    return os.environ.get("SPINKV_DEBUG", "").strip() not in ("", "0", "false", "no")


def one_line(exc: BaseException) -> str:
    """An exception's message on one line (its type's name when it has none)."""
    return " ".join(str(exc).split()) or type(exc).__name__


__all__ = [
    "ChatBusyError",
    "ContextOverflowError",
    "IdentityMismatchError",
    "InternalError",
    "InvalidInputError",
    "KvCacheError",
    "ModelFormatError",
    "ModelNotFoundError",
    "SessionBusyError",
    "SessionFileError",
    "SessionPagesError",
    "SpinkvError",
    "UnsupportedError",
]
