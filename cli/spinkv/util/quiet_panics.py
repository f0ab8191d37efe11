"""Calls into a native library whose panics would print to stderr.

`tokenizers` is Rust with a panic hook of its own, out of our reach: before pyo3 raises a panic
as an exception (which spinkv reports in one line), that hook writes "thread '<unnamed>'
panicked at ..." and perhaps a backtrace to file descriptor 2. `quiet_call(fn, ...)` points fd 2
at a scratch file while fn runs and puts it back when fn returns or raises; what was written
meanwhile (by fn, or by another thread) then goes to the real stderr, without the panic report
when fn panicked. One call holds fd 2 at a time (a lock; a nested call on the same thread runs
inside the outer one's hold). With SPINKV_DEBUG set nothing is held aside: the report belongs
in a bug report.

Only the `spinkv` command holds fd 2 (`hold_stderr()` at its start): it owns its stderr. A
program that imports spinkv as a library keeps its stderr untouched, the report included.

The hold is restored even when an interrupt (Ctrl-C) lands in the middle: fd 2 is put back in
a `finally` that repeats the restore if the interrupt arrives before it; a capture that could
not be forwarded then is forwarded by the next call, or at exit.
"""

from __future__ import annotations

import atexit
import os
import re
import tempfile
import threading
from typing import Any, Callable, TypeVar

from spinkv.errors import debug_enabled

T = TypeVar("T")


def is_panic(exc: BaseException) -> bool:
    """A Rust panic raised by pyo3 (`pyo3_runtime.PanicException`, a BaseException)."""
    return type(exc).__name__ == "PanicException"


class _Hold:
    """fd 2's state, guarded by `lock`."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.depth = 0
        self.scratch: int | None = None
        """An anonymous file (kept for the process) that fd 2 points at during a call."""
        self.saved: int | None = None
        """A duplicate of the real fd 2 while fd 2 is held aside."""
        self.unforwarded = False
        """The scratch file may hold text not yet forwarded (an interrupted call's)."""


_hold = _Hold()
_holding = False
"""Whether quiet_call holds fd 2 aside at all (`hold_stderr`)."""


def hold_stderr(on: bool = True) -> None:
    """Let quiet_call hold fd 2 aside in this process (the CLI's entry point turns it on)."""
    global _holding
    _holding = on


def quiet_call(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """fn(*args, **kwargs) with fd 2 held aside (see the module doc)."""
    if not _holding or debug_enabled():
        return fn(*args, **kwargs)
    with _hold.lock:
        if _hold.depth:
            return fn(*args, **kwargs)
        _hold.depth = 1
        panic: str | None = None
        try:
            _take_fd2()
            return fn(*args, **kwargs)
        except BaseException as exc:
            if is_panic(exc):
                panic = str(exc)
            raise
        finally:
            _hold.depth = 0
            try:
                _restore_fd2()
            except BaseException:  # an interrupt that arrived before fd 2 was back
                _restore_fd2()
                raise
            _forward(panic)


def _take_fd2() -> None:
    if _hold.saved is not None:  # a call interrupted twice before it could put fd 2 back
        _restore_fd2()
    if _hold.unforwarded:
        _forward(None)
    try:
        saved = os.dup(2)
    except OSError:  # no stderr at all: nothing to keep quiet
        return
    if _hold.scratch is None:  # made while fd 2 is open, so it never is fd 2 itself
        try:
            _hold.scratch = _anonymous_file()
        except OSError:  # no file to hold it in: the call runs as it is
            os.close(saved)
            return
    _hold.saved = saved
    _hold.unforwarded = True
    os.dup2(_hold.scratch, 2)


def _restore_fd2() -> None:
    saved = _hold.saved
    if saved is None:
        return
    os.dup2(saved, 2)
    _hold.saved = None
    os.close(saved)


def _anonymous_file() -> int:
    if hasattr(os, "memfd_create"):
        return os.memfd_create("spinkv-stderr", os.MFD_CLOEXEC)
    fd, path = tempfile.mkstemp(prefix="spinkv-stderr-")
    os.unlink(path)
    return fd


def _forward(panic: str | None) -> None:
    """Write what the scratch file holds to fd 2 (without the report of `panic`) and empty it."""
    scratch = _hold.scratch
    if scratch is None:
        return
    size = os.lseek(scratch, 0, os.SEEK_CUR)
    if size:
        data = bytearray()
        while len(data) < size:
            chunk = os.pread(scratch, size - len(data), len(data))
            if not chunk:
                break
            data += chunk
        os.ftruncate(scratch, 0)
        os.lseek(scratch, 0, os.SEEK_SET)
        text = bytes(data) if panic is None else without_panic_report(bytes(data), panic)
        _write_all(2, text)
    _hold.unforwarded = False


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        try:
            written = os.write(fd, view)
        except OSError:  # stderr closed or full: the text has nowhere to go
            return
        view = view[written:]


_PANIC_LINE = re.compile(rb"thread '.*' (\(\d+\) )?panicked at ")


def without_panic_report(data: bytes, message: str) -> bytes:
    """data without the reports Rust's default panic hook wrote for a panic with `message`:
    each is an optional blank line, "thread '...' panicked at LOCATION:", the message's lines,
    then "note: run with `RUST_BACKTRACE=1` ..." or a backtrace ("stack backtrace:", indented
    frames, "note: Some details are omitted ..."). Lines of anything else are kept."""
    lines = data.splitlines(keepends=True)
    message_lines = max(1, len(message.splitlines()))
    kept: list[bytes] = []
    i = 0
    while i < len(lines):
        if not _PANIC_LINE.match(lines[i]):
            kept.append(lines[i])
            i += 1
            continue
        if kept and not kept[-1].strip():
            kept.pop()
        i += 1 + message_lines
        if i < len(lines) and lines[i].startswith(b"note: run with `RUST_BACKTRACE"):
            i += 1
        elif i < len(lines) and lines[i].startswith(b"stack backtrace:"):
            i += 1
            while i < len(lines) and lines[i][:1] in (b" ", b"\t"):
                i += 1
            if i < len(lines) and lines[i].startswith(b"note: Some details are omitted"):
                i += 1
    return b"".join(kept)


@atexit.register
def _forward_at_exit() -> None:
    if not _hold.lock.acquire(timeout=1):  # a thread still inside a call
        return
    try:
        _restore_fd2()
        if _hold.unforwarded:
            _forward(None)
    finally:
        _hold.lock.release()
