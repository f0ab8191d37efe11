"""Which exceptions are the user's to fix, and how each reads in one line."""

from __future__ import annotations

from spinkv.errors import one_line


def user_error_types() -> tuple[type[BaseException], ...]:
    """Errors caused by input, files or the machine: reported in one line, exit code 2
    (but see is_internal_error)."""
    from spinkv.errors import SpinkvError

    return (SpinkvError, OSError, MemoryError)


def is_internal_error(exc: BaseException) -> bool:
    """A caught Rust panic: a bug in spinkv, exit code 1, never blamed on the user."""
    from spinkv.errors import InternalError

    return isinstance(exc, InternalError)


def describe(exc: BaseException) -> str:
    """One line: the message, without Python's decorations."""
    if isinstance(exc, OSError) and exc.strerror:
        target = exc.filename if exc.filename is not None else ""
        return f"{exc.strerror}: {target}" if target else exc.strerror
    if isinstance(exc, MemoryError):
        return "out of memory"
    return one_line(exc)
