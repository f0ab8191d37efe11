"""Files the store writes: bounded file locks, atomic replacement, stale temp files.

Every writer in the store (sessions, prompt caches, model imports) goes through here, so a
crash or a `kill -9` never leaves a half-written file in place, the temp files of dead writers
are cleaned by the next writer, and no wait for a lock is unbounded.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import secrets
import shutil
import stat
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Callable

from spinkv.errors import SessionBusyError, SessionFileError

try:
    import fcntl
except ImportError:  # not POSIX: atomic replacement still holds, writers are not serialised
    fcntl = None  # type: ignore[assignment]

LOCK_TIMEOUT_S = 30.0
"""How long a writer waits for another process's save of the same file (saves take ms)."""

_TEMP_RE = re.compile(r"\.(?P<pid>\d+)\.[0-9a-f]{8}\.tmp")


def pid_alive(pid: int) -> bool:
    """True if a process with this id exists (it may belong to another user)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except OverflowError:
        return False
    return True


def require_regular_file(path: Path, what: str) -> Path:
    """path if it is (or links to) a regular file. A FIFO, device, socket, directory or
    dangling link raises SessionFileError before anything opens it (opening a FIFO blocks)."""
    try:
        info = os.stat(path)
    except FileNotFoundError:
        if os.path.islink(path):
            target = os.readlink(path)
            raise SessionFileError(
                f"{what} {path} is a dangling symbolic link (to {target})"
            ) from None
        raise
    if not stat.S_ISREG(info.st_mode):
        kind = _file_kind(info.st_mode)
        raise SessionFileError(f"{what} {path} is {kind}, not a regular file")
    return path


def _file_kind(mode: int) -> str:
    kinds = [
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
    ]
    return next((name for test, name in kinds if test(mode)), "not a regular file")


def lock_path_for(path: Path) -> Path:
    return path.parent / f".{path.name}.lock"


@contextmanager
def locked(path: Path, *, exclusive: bool, timeout_s: float = LOCK_TIMEOUT_S) -> Iterator[None]:
    """flock on `.NAME.lock` beside path: exclusive for writers, shared for readers. Waits
    at most timeout_s, then raises SessionBusyError."""
    if fcntl is None:
        yield
        return
    lock_path = lock_path_for(path)
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        mode = (fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH) | fcntl.LOCK_NB
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                fcntl.flock(fd, mode)
                break
            except OSError as exc:
                if exc.errno not in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                    raise
                if time.monotonic() >= deadline:
                    raise SessionBusyError(
                        f"{path} stayed locked by another spinkv process for {timeout_s:.0f} s"
                    ) from None
                time.sleep(0.02)
        yield
    finally:
        os.close(fd)  # releases the lock


def temp_path_for(path: Path) -> Path:
    """A fresh temp name beside path that names its writer: `.NAME.PID.RANDOM.tmp`."""
    return path.parent / f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp"


def remove_stale_temps(path: Path) -> list[Path]:
    """Delete temp files of path left by writers that died (kill -9, power loss). Only names
    of exactly temp_path_for's shape whose PID is gone (or is ours: we hold the lock, so no
    save of ours is in flight) are touched. Returns what was removed."""
    removed = []
    prefix = f".{path.name}"
    with contextlib.suppress(OSError):
        for entry in os.scandir(path.parent):
            if not entry.name.startswith(prefix):
                continue
            match = _TEMP_RE.fullmatch(entry.name[len(prefix) :])
            if match is None or not entry.is_file(follow_symlinks=False):
                continue
            pid = int(match["pid"])
            if pid == os.getpid() or not pid_alive(pid):
                with contextlib.suppress(OSError):
                    os.unlink(entry.path)
                    removed.append(Path(entry.path))
    return removed


def write_atomic(
    path: Path,
    write: Callable[[Path], object],
    *,
    check_existing: Callable[[Path], None] | None = None,
) -> None:
    """write(temp_path) then rename over path, under the exclusive lock. check_existing(path)
    runs under the lock first when path exists, and may refuse the overwrite by raising. A
    crash or an error leaves the old file behind; temp files of dead writers are removed."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with locked(path, exclusive=True):
        remove_stale_temps(path)
        if check_existing is not None and (path.exists() or path.is_symlink()):
            check_existing(path)
        replace_with(path, write)
        fsync_dir(path.parent)


def replace_with(path: Path, write: Callable[[Path], object]) -> None:
    """write(temp_path) beside path, then rename it over path; on any failure the temp file
    is removed and path is as it was. No lock: `write_atomic` adds it for the store's files."""
    tmp = temp_path_for(path)
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def tree_size(path: Path) -> int:
    """Total bytes of the regular files under path."""
    return sum(p.stat().st_size for p in Path(path).rglob("*") if p.is_file())


def fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


# ---- temp directories (model imports) --------------------------------------------------------

_TEMP_DIR_RE = re.compile(r"\.(?:tmp|old)-.+-(?P<pid>\d+)-[0-9a-f]{8}")


def temp_dir_for(dest: Path, kind: str = "tmp") -> Path:
    return dest.parent / f".{kind}-{dest.name}-{os.getpid()}-{secrets.token_hex(4)}"


def remove_stale_temp_dirs(parent: Path) -> list[Path]:
    """Delete `.tmp-NAME-PID-RANDOM` / `.old-...` directories of writers that died."""
    removed = []
    with contextlib.suppress(OSError):
        for entry in os.scandir(parent):
            match = _TEMP_DIR_RE.fullmatch(entry.name)
            if match is None or not entry.is_dir(follow_symlinks=False):
                continue
            pid = int(match["pid"])
            if pid != os.getpid() and not pid_alive(pid):
                shutil.rmtree(entry.path, ignore_errors=True)
                removed.append(Path(entry.path))
    return removed


class Lease:
    """An exclusive, non-blocking claim on a file for the life of a process's use of it
    (a chat bound to a session). A second claimant gets SessionBusyError naming the holder's
    PID at once; the claim ends with release() or the process (the kernel drops the flock)."""

    def __init__(self, path: Path, what: str) -> None:
        self.path = path
        self.fd: int | None = None
        if fcntl is None:
            return
        owner = path.parent / f".{path.name}.owner"
        owner.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(owner, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip() or "?"
            os.close(fd)
            if exc.errno in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                raise SessionBusyError(
                    f"{what} is open in another spinkv process (pid {holder}): close it there "
                    "first, or use another name"
                ) from None
            raise
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        self.fd = fd

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def __enter__(self) -> Lease:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
