"""The exception hierarchy shared by every layer of spinkv.

Every error a user can cause (bad path, bad file, unsupported model, bad argument) is raised
as a subclass of :class:`SpinkvError`, so the CLI can print it in one line and exit with 2.
"""

from __future__ import annotations


class SpinkvError(Exception):
    """Base class of every error spinkv reports to the user."""


class ModelNotFoundError(SpinkvError):
    """A model could not be located: no such directory, store name, file or cached repo."""


class ModelFormatError(SpinkvError):
    """A model's files exist but are malformed: truncated, corrupted or inconsistent."""


class UnsupportedError(SpinkvError):
    """A well-formed model that spinkv cannot run: architecture, quant type, tokenizer kind."""


class InvalidInputError(SpinkvError):
    """A bad argument or input value (sampling values, prompt too long, bad name, ...)."""


__all__ = [
    "InvalidInputError",
    "ModelFormatError",
    "ModelNotFoundError",
    "SpinkvError",
    "UnsupportedError",
]


class ContextOverflowError(InvalidInputError):
    """A prompt (or a conversation) longer than the context the session can hold."""


__all__ += ["ContextOverflowError"]
