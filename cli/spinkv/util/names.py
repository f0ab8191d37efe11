"""Names that become file names in the store (sessions, models): one strict rule for all.

A name is 1-100 characters of letters, digits, '.', '_' and '-', starting with a letter or
digit, so it can never be '', '.', '..', a path, or carry a newline or a slash.
"""

from __future__ import annotations

import re

from spinkv.errors import InvalidInputError

_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")


def is_valid_name(name: object) -> bool:
    return isinstance(name, str) and _NAME_RE.fullmatch(name) is not None


def check_name(name: object, kind: str) -> str:
    """name if it is valid, else InvalidInputError naming the rule."""
    if not is_valid_name(name):
        raise InvalidInputError(
            f"invalid {kind} name {name!r}: use letters, digits, '.', '_' and '-' "
            "(up to 100, starting with a letter or digit)"
        )
    assert isinstance(name, str)
    return name
