"""The native runtime under hostile input: errors are spinkv's own classes (never pyo3's
OverflowError or PanicException), panics stay quiet, absurd model configs and thread counts
are one clear error instead of an abort or a hang, and saved KV pages are never reused on
weights that merely look like the ones that made them.

Everything runs on the tiny random model, in subprocesses where a failure could hang or
abort the interpreter running pytest."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import spinkv
from helpers import assert_one_line_error, run_python, spinkv_cli
from spinkv import errors


def run_cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return spinkv_cli(*args, timeout=timeout)


@pytest.fixture(scope="module")
def tiny_dir(native: ModuleType, make_tiny: Callable[..., Path]) -> Path:
    return make_tiny()


@pytest.fixture(scope="module")
def loaded(tiny_dir: Path) -> Any:
    return spinkv.load(tiny_dir)


def model_copy(src: Path, dst: Path, **config: Any) -> Path:
    shutil.copytree(src, dst)
    path = dst / "config.json"
    cfg = json.loads(path.read_text())
    cfg.update(config)
    # json.dumps writes float("nan") as the (invalid JSON) token NaN, as a careless tool would.
    path.write_text(json.dumps(cfg))
    return dst


# ---- 1. one exception hierarchy, defined in Python -------------------------------------------


RUST_RAISED = (
    "SpinkvError",
    "ModelNotFoundError",
    "ModelFormatError",
    "UnsupportedError",
    "InvalidInputError",
    "ContextOverflowError",
    "KvCacheError",
    "SessionFileError",
    "SessionPagesError",
    "SessionBusyError",
    "IdentityMismatchError",
    "InternalError",
)


def test_native_exception_classes_are_the_python_ones(native: ModuleType) -> None:
    for name in RUST_RAISED:
        assert getattr(native, name) is getattr(errors, name), name
        assert issubclass(getattr(native, name), spinkv.SpinkvError), name


def test_rust_errors_are_spinkv_errors_of_the_right_class(
    loaded: Any, tiny_dir: Path, tmp_path: Path, native: ModuleType
) -> None:
    truncated = tmp_path / "truncated"
    shutil.copytree(tiny_dir, truncated)
    weights = truncated / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    with pytest.raises(errors.ModelFormatError) as exc_info:
        native.Model.load(str(truncated))
    assert isinstance(exc_info.value, spinkv.SpinkvError)

    session = loaded.session()
    with pytest.raises(errors.InvalidInputError, match="outside the vocabulary"):
        session.prefill([1, 2, 10**6])
    with pytest.raises(errors.InvalidInputError):
        native.Sampler(temperature=-1.0)
    with pytest.raises(errors.ContextOverflowError, match="does not fit"):
        session.prefill([1] * (loaded.max_context + 1))
    with pytest.raises(errors.ContextOverflowError):
        loaded.session({"preset": "fp16", "max_context": 16}).prefill([1] * 17)


def test_identity_mismatch_carries_the_differing_fields(
    loaded: Any, tmp_path: Path, native: ModuleType
) -> None:
    chat = loaded.chat(kv="turbo", max_tokens=4)
    chat.ask("Hello there")
    chat.save(tmp_path / "a.spkv")
    other = loaded.session({"preset": "kivi2"})
    with pytest.raises(errors.IdentityMismatchError) as exc_info:
        other.load(str(tmp_path / "a.spkv"), loaded.identity_extra)
    assert isinstance(exc_info.value, native.IdentityMismatchError)
    assert "bit_allocation" in exc_info.value.fields


# ---- 2. panics -------------------------------------------------------------------------------


def test_a_panic_is_a_quiet_internal_error() -> None:
    code = """
        from spinkv import _native, errors
        try:
            _native._panic_for_tests("deliberate")
        except errors.InternalError as exc:
            print(exc)
    """
    done = run_python(code, RUST_BACKTRACE="1")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "internal error (please report): deliberate"
    assert done.stderr == ""
    loud = run_python(code, SPINKV_DEBUG="1")
    assert "panicked" in loud.stderr and "deliberate" in loud.stderr


# ---- 3. absurd config.json values ------------------------------------------------------------


@pytest.mark.parametrize(
    ("config", "fragment"),
    [
        ({"num_hidden_layers": 2**64 - 1}, "num_hidden_layers"),
        ({"num_hidden_layers": 10**9}, "num_hidden_layers is 1000000000"),
        ({"num_hidden_layers": 2**31}, "num_hidden_layers is 2147483648"),
        ({"num_hidden_layers": 1}, "weights hold 2 layers"),
        ({"num_hidden_layers": 3}, "weights hold 2 layers"),
        ({"num_attention_heads": 0}, "num_attention_heads must be positive"),
        ({"num_key_value_heads": 0}, "num_key_value_heads must be positive"),
        ({"max_position_embeddings": 0}, "max_position_embeddings must be positive"),
        ({"max_position_embeddings": 2**62}, "max_position_embeddings"),
        ({"hidden_size": 2**40}, "embed_tokens"),
        ({"head_dim": 2**40}, "q_proj"),
        ({"rms_norm_eps": -1}, "rms_norm_eps"),
        ({"rms_norm_eps": 0}, "rms_norm_eps"),
        ({"rope_theta": float("nan")}, "rope_theta is NaN"),
        ({"rope_theta": -1}, "rope_theta"),
        ({"rope_theta": 0}, "rope_theta"),
    ],
    ids=lambda v: json.dumps(v) if isinstance(v, dict) else None,
)
def test_absurd_config_values_are_one_clear_error(
    tiny_dir: Path, tmp_path: Path, config: dict[str, Any], fragment: str
) -> None:
    copy = model_copy(tiny_dir, tmp_path / "copy", **config)
    done = run_cli("run", "--model", str(copy), "hi", "-n", "2")
    assert_one_line_error(done, fragment)


# ---- 4. thread counts ------------------------------------------------------------------------


def test_absurd_thread_counts_are_rejected_promptly(tiny_dir: Path) -> None:
    code = f"""
        import spinkv
        from spinkv import _native, errors
        for n in (1000, 99999999999, 257):
            try:
                spinkv.load({str(tiny_dir)!r}, threads=n)
            except errors.InvalidInputError as exc:
                print("refused", n, exc)
        for n in (0, -1, 2**70):
            try:
                _native.set_threads(n)
            except errors.InvalidInputError:
                print("refused", n)
        _native.set_threads(256)
        print("threads", _native.threads())
    """
    done = run_python(code, timeout=60)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert [" ".join(line.split()[:2]) for line in lines[:6]] == [
        "refused 1000",
        "refused 99999999999",
        "refused 257",
        "refused 0",
        "refused -1",
        f"refused {2**70}",
    ], done.stdout
    assert "at most 256" in lines[0]
    assert lines[-1] == "threads 256"


# ---- 5. the model hash at restore time -------------------------------------------------------


def test_pages_are_not_reused_on_same_size_weights_with_the_old_mtime(
    tiny_dir: Path, make_tiny: Callable[..., Path], tmp_path: Path
) -> None:
    model = tmp_path / "model"
    shutil.copytree(tiny_dir, model)
    weights = model / "model.safetensors"
    session_file = tmp_path / "a.spkv"
    save = f"""
        import spinkv
        chat = spinkv.load({str(model)!r}).chat(kv="turbo", max_tokens=4)
        chat.ask("Hello there")
        chat.save({str(session_file)!r})
    """
    done = run_python(save)
    assert done.returncode == 0, done.stderr
    assert (model / ".spinkv-model-hash").is_file(), "the hash cache this test defeats"

    other = (make_tiny(seed=1) / "model.safetensors").read_bytes()
    assert len(other) == weights.stat().st_size and other != weights.read_bytes()
    before = weights.stat()
    replacement = model / "replacement.tmp"
    replacement.write_bytes(other)
    os.replace(replacement, weights)
    os.utime(weights, ns=(before.st_atime_ns, before.st_mtime_ns))

    restore = f"""
        import spinkv
        from spinkv import errors
        loaded = spinkv.load({str(model)!r})
        session = loaded.session("turbo")
        try:
            session.load({str(session_file)!r}, loaded.identity_extra)
            print("reused")
        except errors.IdentityMismatchError as exc:
            print("refused", ",".join(exc.fields))
        outcome = loaded.chat(kv="turbo").restore({str(session_file)!r})
        print("chat", outcome.reused, ",".join(outcome.fields))
    """
    done = run_python(restore)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["refused model_hash", "chat False model_hash"]


# ---- 6. token ids from Python ----------------------------------------------------------------


@pytest.mark.parametrize("bad", [-1, 2**32, 2**70, 10**6])
def test_bad_token_ids_are_invalid_input(loaded: Any, bad: int) -> None:
    session = loaded.session()
    with pytest.raises(errors.InvalidInputError, match=f"token id {bad} is outside the vocabulary"):
        session.prefill([1, bad])
    with pytest.raises(errors.InvalidInputError, match=f"token id {bad} is outside the vocabulary"):
        session.decode(bad)
    assert len(session) == 0


def test_other_bad_integers_are_invalid_input(loaded: Any, native: ModuleType) -> None:
    session = loaded.session()
    for call in (
        lambda: session.prefill(["a"]),
        lambda: session.prefill("abc"),
        lambda: session.truncate(-1),
        lambda: session.reserve(-5),
        lambda: native.Sampler(seed=-1),
        lambda: native.Sampler(seed=2**70),
    ):
        with pytest.raises(errors.InvalidInputError):
            call()


# ---- 7. token counts beyond the context ------------------------------------------------------


def test_huge_token_counts_are_refused_before_allocating(loaded: Any) -> None:
    session = loaded.session()
    with pytest.raises(errors.ContextOverflowError, match="at most"):
        session.reserve(10**12)
    with pytest.raises(errors.InvalidInputError, match="max_context"):
        loaded.session({"max_context": 10**12})
    with pytest.raises(errors.InvalidInputError, match="max_context"):
        loaded.session({"max_context": 2**70})
    session.reserve(loaded.max_context)
    assert len(session) == 0
