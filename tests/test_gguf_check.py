"""The bounded GGUF layout walk: hostile counts and lengths are refused before gguf-py reads."""

from __future__ import annotations

import contextlib
import random
import struct
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from spinkv.errors import ModelFormatError
from spinkv.models.gguf_check import check_gguf_layout
from spinkv.models.gguf_import import import_gguf


def header(n_tensors: int, n_fields: int, version: int = 3) -> bytes:
    return b"GGUF" + struct.pack("<IQQ", version, n_tensors, n_fields)


def string(text: bytes) -> bytes:
    return struct.pack("<Q", len(text)) + text


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        # An array of 2^40 bytes declared in 53 bytes (gguf-py loops once per declared item).
        (header(0, 1) + string(b"x.arr") + struct.pack("<IIQ", 9, 0, 1 << 40), "past the end"),
        (header(0, 1) + string(b"x.s") + struct.pack("<IIQ", 9, 8, 1 << 40), "cannot fit"),
        (header(0, 1) + string(b"x.n") + struct.pack("<IIQ", 9, 9, 1), "array of arrays"),
        (header(0, 1) + string(b"x.t") + struct.pack("<I", 99) + b"\0" * 8, "unknown"),
        (header(0, 1) + struct.pack("<Q", 1 << 62) + b"\0" * 16, "bytes long"),
        (header(0, 1 << 40), "cannot fit"),
        (header(1 << 40, 0), "cannot fit"),
        (header(1, 0) + string(b"t") + struct.pack("<I", 5) + b"\0" * 64, "dimensions"),
        (header(0, 0, version=1), "version 1"),
        (b"GGUX" + b"\0" * 20, "bad magic"),
    ],
)
def test_hostile_layouts_are_refused_at_once(tmp_path: Path, body: bytes, reason: str) -> None:
    path = tmp_path / "hostile.gguf"
    path.write_bytes(body)
    started = time.perf_counter()
    with pytest.raises(ModelFormatError, match=reason):
        check_gguf_layout(path)
    with pytest.raises(ModelFormatError):
        import_gguf(path, out_dir=tmp_path / "m")
    assert time.perf_counter() - started < 10
    assert not (tmp_path / "m").exists()


def test_a_real_gguf_passes_and_every_cut_or_flip_is_refused_or_passes(
    make_gguf: Callable[..., Path], tmp_path: Path
) -> None:
    """Property: on a valid file the walk passes; on any truncation or corrupted byte of its
    header, metadata and tensor table it either passes or raises ModelFormatError, quickly."""
    source = make_gguf("Q8_0")
    check_gguf_layout(source)
    data = source.read_bytes()
    # Where the tensor data starts is past the table; cut and flip inside the table only.
    table_end = min(len(data), 64 * 1024)
    rng = random.Random(12)
    out = tmp_path / "mutant.gguf"
    for _ in range(300):
        mutant = bytearray(data)
        if rng.random() < 0.5:
            mutant = mutant[: rng.randrange(0, table_end)]
        else:
            for _ in range(rng.randrange(1, 4)):
                at = rng.randrange(0, table_end)
                mutant[at] = rng.choice([0x00, 0xFF, 0x7F, 0x80, mutant[at] ^ 0x40])
        out.write_bytes(bytes(mutant))
        started = time.perf_counter()
        with contextlib.suppress(ModelFormatError):
            check_gguf_layout(out)
        assert time.perf_counter() - started < 5
