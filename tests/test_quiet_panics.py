"""A panic inside `tokenizers` reaches the user as our one line only: its panic hook's report
is kept off stderr (spinkv.util.quiet_panics), while everything else written to stderr during
the call still arrives, and fd 2 is always put back."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest
from helpers import (
    PANICKY_TEXT,
    assert_one_line_error,
    panicky_copy,
    run_on_threads,
    spinkv_cli,
)
from spinkv.errors import ModelFormatError
from spinkv.tokenizer import Tokenizer, load_tokenizer
from spinkv.util import quiet_panics
from spinkv.util.quiet_panics import quiet_call, without_panic_report

GIVES_UP = PANICKY_TEXT


@pytest.fixture(scope="module")
def panicky_model(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model with a pre-tokenizer regex that backtracks past onig's limit."""
    return panicky_copy(tiny_model_dir, tmp_path_factory.mktemp("panicky") / "m")


@pytest.fixture
def quiet(monkeypatch: pytest.MonkeyPatch) -> None:
    """The CLI's setting: fd 2 held aside during native calls."""
    monkeypatch.delenv("SPINKV_DEBUG", raising=False)
    monkeypatch.setattr(quiet_panics, "_holding", True)


def fd2_identity() -> tuple[int, int]:
    st = os.fstat(2)
    return st.st_dev, st.st_ino


@pytest.mark.parametrize("backtrace", ["0", "1"])
def test_the_cli_shows_one_line_for_a_tokenizer_panic(panicky_model: Path, backtrace: str) -> None:
    done = spinkv_cli(
        "run", "--raw", "-n", "1", "-m", str(panicky_model), GIVES_UP, RUST_BACKTRACE=backtrace
    )
    assert_one_line_error(done, "tokenizer failed while encoding")


def test_with_spinkv_debug_the_panic_report_stays(panicky_model: Path) -> None:
    done = spinkv_cli(
        "run", "--raw", "-n", "1", "-m", str(panicky_model), GIVES_UP, SPINKV_DEBUG="1"
    )
    assert done.returncode == 2
    assert "panicked at" in done.stderr


def test_a_panic_is_quiet_and_other_output_is_kept(
    panicky_model: Path, quiet: None, capfd: pytest.CaptureFixture[str]
) -> None:
    tokenizer = load_tokenizer(panicky_model)
    before = fd2_identity()

    def encode_after_a_note(text: str) -> object:
        os.write(2, b"written during the call\n")
        return tokenizer.hf.encode(text, add_special_tokens=False)

    with pytest.raises(BaseException) as caught:
        quiet_call(encode_after_a_note, GIVES_UP)
    assert quiet_panics.is_panic(caught.value)
    assert fd2_identity() == before
    err = capfd.readouterr().err
    assert err == "written during the call\n"
    with pytest.raises(ModelFormatError, match="tokenizer failed while encoding"):
        tokenizer.encode(GIVES_UP)
    assert capfd.readouterr().err == ""
    assert fd2_identity() == before
    assert tokenizer.encode("ab ab") == tokenizer.hf.encode("ab ab", add_special_tokens=False).ids


def test_what_a_call_writes_is_forwarded(quiet: None, capfd: pytest.CaptureFixture[str]) -> None:
    before = fd2_identity()

    def noisy(value: int) -> int:
        os.write(2, b"a warning from native code\n")
        return value + 1

    assert quiet_call(noisy, 41) == 42
    assert capfd.readouterr().err == "a warning from native code\n"

    def failing() -> None:
        os.write(2, b"before the error\n")
        raise ValueError("not a panic")

    with pytest.raises(ValueError, match="not a panic"):
        quiet_call(failing)
    assert capfd.readouterr().err == "before the error\n"

    def interrupted() -> None:
        os.write(2, b"before Ctrl-C\n")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        quiet_call(interrupted)
    assert capfd.readouterr().err == "before Ctrl-C\n"
    assert fd2_identity() == before


def test_nested_calls_share_the_outer_hold(quiet: None, capfd: pytest.CaptureFixture[str]) -> None:
    def inner() -> str:
        os.write(2, b"inner\n")
        return "done"

    assert quiet_call(lambda: quiet_call(inner)) == "done"
    assert capfd.readouterr().err == "inner\n"


def test_an_interrupted_hold_is_put_back_by_the_next_call(
    quiet: None, capfd: pytest.CaptureFixture[str]
) -> None:
    """If an interrupt kept a call from putting fd 2 back (twice in a row), the next call (or
    exit) does, and forwards what the scratch file caught meanwhile."""
    before = fd2_identity()
    with quiet_panics._hold.lock:
        quiet_panics._take_fd2()  # held, as an interrupted call would leave it
    os.write(2, b"caught while held\n")
    assert fd2_identity() != before
    assert quiet_call(lambda: 7) == 7
    assert fd2_identity() == before
    assert capfd.readouterr().err == "caught while held\n"


def test_threads_encoding_at_once_keep_stderr_clean(
    panicky_model: Path, quiet: None, capfd: pytest.CaptureFixture[str]
) -> None:
    """Chat streaming and server threads: calls on several threads at once, some panicking,
    some writing to stderr themselves; only the panic reports are dropped."""
    tokenizer = load_tokenizer(panicky_model)
    before = fd2_identity()
    expected = tokenizer.encode("hello there")
    lock = threading.Lock()
    failures: list[str] = []

    def work(i: int) -> None:
        for round_ in range(20):
            if (i + round_) % 3 == 0:
                try:
                    tokenizer.encode(GIVES_UP)
                except ModelFormatError:
                    continue
                with lock:
                    failures.append("no panic")
            elif (i + round_) % 3 == 1:
                os.write(2, f"thread {i} round {round_}\n".encode())
            else:
                assert tokenizer.encode("hello there") == expected
                stream = tokenizer.stream()
                text = "".join(stream.push(t) for t in expected) + stream.flush()
                assert text == "hello there"

    run_on_threads(work, 4)
    assert failures == []
    assert fd2_identity() == before
    err = capfd.readouterr().err
    assert "panicked" not in err and "backtrace" not in err
    lines = sorted(err.splitlines())
    wanted = sorted(
        f"thread {i} round {r}\n".strip() for i in range(4) for r in range(20) if (i + r) % 3 == 1
    )
    assert lines == wanted


REPORT_PLAIN = (
    b"\nthread '<unnamed>' (4242) panicked at /cargo/onig-6.5.3/src/lib.rs:647:23:\n"
    b"Onig: Regex search error: retry-limit-in-match over\n"
    b"note: run with `RUST_BACKTRACE=1` environment variable to display a backtrace\n"
)
REPORT_BACKTRACE = (
    b"\nthread '<unnamed>' panicked at /cargo/onig-6.5.3/src/lib.rs:647:23:\n"
    b"Onig: Regex search error: retry-limit-in-match over\n"
    b"stack backtrace:\n"
    b"   0: __rustc::rust_begin_unwind\n"
    b"   1: core::panicking::panic_fmt\n"
    b"             at /rustc/library/core/src/panicking.rs:75:14\n"
    b"note: Some details are omitted, run with `RUST_BACKTRACE=full` for a verbose backtrace.\n"
)
MESSAGE = "Onig: Regex search error: retry-limit-in-match over"


@pytest.mark.parametrize("report", [REPORT_PLAIN, REPORT_BACKTRACE])
def test_only_the_panic_report_is_dropped(report: bytes) -> None:
    assert without_panic_report(report, MESSAGE) == b""
    around = b"before\n" + report + b"after\n"
    assert without_panic_report(around, MESSAGE) == b"before\nafter\n"
    twice = report + b"between\n" + report.replace(b"(4242) ", b"")
    assert without_panic_report(twice, MESSAGE) == b"between\n"
    assert without_panic_report(b"no report here\n", MESSAGE) == b"no report here\n"
    two_line = report.replace(MESSAGE.encode(), b"first line\nsecond line")
    assert without_panic_report(b"x\n" + two_line, "first line\nsecond line") == b"x\n"


def test_tokenizer_results_are_unchanged(tiny_model_dir: Path, quiet: None) -> None:
    tokenizer = Tokenizer.from_dir(tiny_model_dir)
    text = "The quick brown fox <|im_end|> jumps."
    ids = tokenizer.encode(text)
    assert ids == tokenizer.hf.encode(text, add_special_tokens=False).ids
    assert tokenizer.decode(ids) == tokenizer.hf.decode(ids, skip_special_tokens=True)


def test_a_library_user_keeps_the_report(
    panicky_model: Path, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Outside the spinkv command, fd 2 is never touched: the caller's stderr is theirs."""
    monkeypatch.delenv("SPINKV_DEBUG", raising=False)
    tokenizer = load_tokenizer(panicky_model)
    with pytest.raises(ModelFormatError):
        tokenizer.encode(GIVES_UP)
    assert "panicked" in capfd.readouterr().err
