"""What the end-to-end tests share: running `spinkv` (or Python) in a child process that
imports the same spinkv as the tests, and checking the one-line error contract."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import threading
from collections.abc import Callable
from pathlib import Path

import spinkv

SOURCE_ROOT = str(Path(spinkv.__file__).resolve().parent.parent)


def cli_env(**extra: str) -> dict[str, str]:
    """The environment for a child: the same spinkv this test imports, SPINKV_DEBUG and
    RUST_BACKTRACE unset (they add output on purpose)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([SOURCE_ROOT, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.pop("SPINKV_DEBUG", None)
    env.pop("RUST_BACKTRACE", None)
    env.update(extra)
    return env


def spinkv_cli(
    *args: str, stdin: str | None = None, timeout: float = 300, **env: str
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "spinkv", *args],
        input=stdin if stdin is not None else "",
        capture_output=True,
        text=True,
        timeout=timeout,
        env=cli_env(**env),
    )


def run_python(code: str, timeout: float = 60, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=cli_env(**env),
    )


def assert_one_line_error(done: subprocess.CompletedProcess[str], *fragments: str) -> None:
    """Exit code 2, one `error: ...` line on stderr holding every fragment, no traceback,
    panic message or backtrace."""
    output = done.stdout + done.stderr
    assert done.returncode == 2, output
    for noise in ("Traceback", "panicked", "RUST_BACKTRACE", "stack backtrace"):
        assert noise not in output, output
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("error: "), lines[0]
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


def run_on_threads(work: Callable[[int], None], n: int, timeout: float = 300) -> None:
    """work(0) ... work(n - 1), each on its own thread, all at once; raises the first error a
    thread hit, or AssertionError if one is still running after `timeout` seconds."""
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            work(i)
        except BaseException as exc:  # noqa: BLE001 - raised again on the calling thread
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=timeout)
    assert not any(thread.is_alive() for thread in threads), "a thread did not finish"
    if errors:
        raise errors[0]


PANICKY_TEXT = "a" * 40 + "b"
"""Text on which `panicky_copy`'s pre-tokenizer regex gives up (a panic inside tokenizers)."""


def panicky_copy(model_dir: Path, dest: Path) -> Path:
    """A copy of a model at dest whose pre-tokenizer regex backtracks past onig's limit on
    PANICKY_TEXT, so `tokenizers` panics there."""
    model = Path(shutil.copytree(model_dir, dest))
    spec = json.loads((model / "tokenizer.json").read_text())
    split = {
        "type": "Split",
        "pattern": {"Regex": "(a|a|a|a)+$"},
        "behavior": "Isolated",
        "invert": False,
    }
    spec["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [split, spec["pre_tokenizer"]]}
    (model / "tokenizer.json").write_text(json.dumps(spec))
    return model
