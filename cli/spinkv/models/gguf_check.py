"""A bounded walk over a GGUF file's header, metadata and tensor table, before gguf-py reads it.

gguf.GGUFReader trusts the counts it reads: an array declared with 2^40 items makes it loop
(and allocate) once per declared item, whatever the file holds, so 53 bytes can exhaust the
machine. This walk checks every count and length against the bytes actually present before
anything depends on it, refuses what no model needs (nested arrays, more than four tensor
dimensions, more strings than any vocabulary), and touches each byte at most once. Only then
is the file handed to gguf-py.
"""

from __future__ import annotations

import mmap
import struct
from pathlib import Path

from spinkv.errors import ModelFormatError

MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
# Value types of the GGUF spec and their sizes; STRING and ARRAY are variable.
SCALAR_SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
STRING = 8
ARRAY = 9
MAX_DIMS = 4  # GGML_MAX_DIMS
MAX_KEY_BYTES = 65535
# Strings in all of a file's arrays together: vocabularies and merges run to a few hundred
# thousand; this is ten times the largest, and keeps the walk (one step per string) short.
MAX_STRINGS = 1 << 23


class _Cursor:
    """Reads little- or big-endian values from a buffer, refusing any read past its end."""

    def __init__(self, data: mmap.mmap | bytes, path: Path, order: str) -> None:
        self.data = data
        self.size = len(data)
        self.at = 0
        self.path = path
        self.order = order

    def fail(self, what: str) -> ModelFormatError:
        return ModelFormatError(f"{self.path} is not a valid GGUF file: {what}")

    def take(self, n: int, what: str) -> int:
        """Skips n bytes; returns where they start."""
        if n < 0 or n > self.size - self.at:
            raise self.fail(f"{what} runs past the end of the file (offset {self.at})")
        start = self.at
        self.at += n
        return start

    def u32(self, what: str) -> int:
        start = self.take(4, what)
        return int(struct.unpack_from(self.order + "I", self.data, start)[0])

    def u64(self, what: str) -> int:
        start = self.take(8, what)
        return int(struct.unpack_from(self.order + "Q", self.data, start)[0])

    def string(self, what: str, limit: int | None = None) -> int:
        """Skips a length-prefixed string; returns its length."""
        length = self.u64(f"{what}'s length")
        if limit is not None and length > limit:
            raise self.fail(f"{what} is {length} bytes long (at most {limit})")
        self.take(length, what)
        return length


def check_gguf_layout(path: Path) -> None:
    """Raise ModelFormatError unless every count and length in the file's header, metadata and
    tensor table fits the bytes present (see the module doc)."""
    path = Path(path)
    try:
        with path.open("rb") as file:
            size = path.stat().st_size
            if size < 24:
                raise ModelFormatError(f"{path} is not a valid GGUF file: {size} bytes")
            with mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as data:
                _walk(data, path)
    except OSError as exc:
        raise ModelFormatError(f"cannot read {path}: {exc.strerror or exc}") from None


def _walk(data: mmap.mmap | bytes, path: Path) -> None:
    if data[:4] != MAGIC:
        raise ModelFormatError(f"{path} is not a valid GGUF file: bad magic")
    order = "<"
    version = struct.unpack_from("<I", data, 4)[0]
    if version & 0xFFFF == 0:  # written on a big-endian machine
        order = ">"
        version = struct.unpack_from(">I", data, 4)[0]
    if version not in SUPPORTED_VERSIONS:
        raise ModelFormatError(
            f"{path} is not a valid GGUF file: version {version} (spinkv reads versions 2 and 3)"
        )
    cursor = _Cursor(data, path, order)
    cursor.take(8, "header")
    n_tensors = cursor.u64("tensor count")
    n_fields = cursor.u64("metadata count")
    # The smallest field is a key length, a type and one byte; the smallest tensor entry a
    # name length, a dimension count, a type and an offset.
    if n_fields > (cursor.size - cursor.at) // 13:
        raise cursor.fail(f"{n_fields} metadata fields cannot fit in {cursor.size} bytes")
    if n_tensors > (cursor.size - cursor.at) // 24:
        raise cursor.fail(f"{n_tensors} tensors cannot fit in {cursor.size} bytes")
    strings = 0
    for _ in range(n_fields):
        cursor.string("a metadata key", MAX_KEY_BYTES)
        value_type = cursor.u32("a metadata type")
        strings += _skip_value(cursor, value_type, nested=False)
        if strings > MAX_STRINGS:
            raise cursor.fail(f"more than {MAX_STRINGS} strings in its metadata")
    for _ in range(n_tensors):
        cursor.string("a tensor name", MAX_KEY_BYTES)
        n_dims = cursor.u32("a tensor's dimension count")
        if n_dims > MAX_DIMS:
            raise cursor.fail(f"a tensor with {n_dims} dimensions (at most {MAX_DIMS})")
        cursor.take(8 * n_dims, "a tensor's dimensions")
        cursor.take(4 + 8, "a tensor's type and offset")


def _skip_value(cursor: _Cursor, value_type: int, *, nested: bool) -> int:
    """Skips one metadata value; returns how many strings it held."""
    if value_type in SCALAR_SIZES:
        cursor.take(SCALAR_SIZES[value_type], "a metadata value")
        return 0
    if value_type == STRING:
        cursor.string("a metadata string")
        return 1
    if value_type != ARRAY:
        raise cursor.fail(f"unknown metadata value type {value_type}")
    if nested:
        raise cursor.fail("an array of arrays (no model metadata has one)")
    item_type = cursor.u32("an array's item type")
    count = cursor.u64("an array's length")
    left = cursor.size - cursor.at
    if item_type in SCALAR_SIZES:
        if count > left // SCALAR_SIZES[item_type]:
            raise cursor.fail(f"an array of {count} items runs past the end of the file")
        cursor.take(count * SCALAR_SIZES[item_type], "an array")
        return 0
    if item_type == STRING:
        if count > left // 8 or count > MAX_STRINGS:
            raise cursor.fail(f"an array of {count} strings cannot fit in the file")
        for _ in range(count):
            cursor.string("an array's string")
        return count
    if item_type == ARRAY:
        raise cursor.fail("an array of arrays (no model metadata has one)")
    raise cursor.fail(f"unknown array item type {item_type}")
