"""Hostile and first-time use (issue 8): nothing lost, nothing hangs, one line per error.

Each test names the case of the issue it covers. Cases in the Rust runtime (config
dimensions, threads, model hash, panics, Rust-raised error classes) are in
test_native_robustness.py.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest
import spinkv
from conftest import write_gguf_from_hf
from helpers import assert_one_line_error, cli_env, run_on_threads, spinkv_cli
from spinkv.api import LoadedModel
from spinkv.errors import (
    ChatBusyError,
    InvalidInputError,
    ModelFormatError,
    SessionBusyError,
    SessionFileError,
    SpinkvError,
)
from spinkv.sessions.store import Transcript, save_chat, session_path
from test_cli import ChatProcess


@pytest.fixture(scope="module")
def tiny(native: ModuleType, make_tiny: Callable[..., Path]) -> LoadedModel:
    return spinkv.load(make_tiny())


def saved_chat(model: LoadedModel, name: str, turns: int = 3) -> Path:
    chat = model.chat(max_tokens=4)
    for i in range(turns):
        chat.ask(f"turn {i}")
    path = session_path(name)
    save_chat(chat, path)
    return path


# ---- data loss ------------------------------------------------------------------------------


@pytest.mark.parametrize("name", [".", "", "..", "./", "a/b", "nl\n"])
def test_1_models_rm_refuses_names_that_are_not_a_model(
    tiny: LoadedModel, spinkv_home: Path, name: str
) -> None:
    stored = spinkv_home / "models" / "kept"
    stored.mkdir(parents=True)
    (stored / "config.json").write_text("{}")
    done = spinkv_cli("models", "rm", name)
    assert_one_line_error(done)
    assert (stored / "config.json").is_file(), "the store is untouched"


def test_1_models_rm_refuses_a_directory_that_is_not_a_model(spinkv_home: Path) -> None:
    odd = spinkv_home / "models" / "notes"
    odd.mkdir(parents=True)
    (odd / "mine.txt").write_text("keep me")
    assert_one_line_error(spinkv_cli("models", "rm", "notes"), "does not look like a model")
    assert (odd / "mine.txt").read_text() == "keep me"


def test_1_models_rm_removes_a_download_cut_short(spinkv_home: Path) -> None:
    """`models list` shows a directory without config.json as broken; `rm` must clear it when
    it holds only a model's files, and still keep any directory holding something else."""
    cut = spinkv_home / "models" / "cut"
    cut.mkdir(parents=True)
    (cut / "tokenizer.json").write_text("{}")
    (cut / "model-00001-of-00002.safetensors").write_bytes(b"\0" * 8)
    done = spinkv_cli("models", "rm", "cut")
    assert done.returncode == 0, done.stderr
    assert not cut.exists()
    mixed = spinkv_home / "models" / "mixed"
    (mixed / "sub").mkdir(parents=True)
    (mixed / "tokenizer.json").write_text("{}")
    assert_one_line_error(spinkv_cli("models", "rm", "mixed"), "sub is not a model file")
    assert (mixed / "tokenizer.json").is_file() and (mixed / "sub").is_dir()


def test_2_prompt_cache_never_replaces_a_chat_session(tiny: LoadedModel, spinkv_home: Path) -> None:
    path = saved_chat(tiny, "three")
    before = path.read_bytes()
    done = spinkv_cli("run", "-m", str(tiny.path), "--prompt-cache", str(path), "hi", "-n", "2")
    assert_one_line_error(done, "chat session of 3 turns", "not overwritten")
    assert path.read_bytes() == before


def test_2_chat_save_never_replaces_a_prompt_cache(tiny: LoadedModel, spinkv_home: Path) -> None:
    path = session_path("pc")
    path.parent.mkdir(parents=True, exist_ok=True)
    done = spinkv_cli("run", "-m", str(tiny.path), "--prompt-cache", str(path), "hi", "-n", "2")
    assert done.returncode == 0, done.stderr
    before = path.read_bytes()
    chat = tiny.chat(max_tokens=2)
    chat.ask("hello")
    with pytest.raises(InvalidInputError, match="prompt cache"):
        save_chat(chat, path)
    assert path.read_bytes() == before


def test_3_a_second_chat_on_a_session_is_refused_not_merged_away(
    tiny: LoadedModel, spinkv_home: Path
) -> None:
    first = ChatProcess("-m", str(tiny.path), "-n", "3", "--session", "cc")
    try:
        first.send("hello\n")
        first.stderr.wait_for(lambda text: "prefill" in text, timeout=120)
        second = spinkv_cli("chat", "-m", str(tiny.path), "-n", "3", "--session", "cc", stdin="x\n")
        assert_one_line_error(second, "session cc is open in another spinkv process")
        first.send("second turn\n")
        first.stderr.wait_for(lambda text: text.count("prefill") >= 2, timeout=120)
        assert first.finish() == 0
    finally:
        first.kill()
    listed = json.loads(spinkv_cli("sessions", "list", "--json").stdout)
    assert [(s["name"], s["turns"]) for s in listed] == [("cc", 2)], "no turn was lost"
    # The lease ends with the process: the session opens again.
    again = spinkv_cli("chat", "-m", str(tiny.path), "-n", "3", "--session", "cc", stdin="3rd\n")
    assert again.returncode == 0, again.stderr


def test_3_sessions_rm_waits_for_no_one_and_refuses_an_open_session(
    tiny: LoadedModel, spinkv_home: Path
) -> None:
    from spinkv.sessions.store import claim_session, remove_session

    saved_chat(tiny, "open", turns=1)
    code = (
        "from spinkv.sessions.store import claim_session; import time; l = claim_session('open');"
    )
    code += " print('held', flush=True); time.sleep(60)"
    holder = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env=cli_env()
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        with pytest.raises(SessionBusyError, match=f"pid {holder.pid}"):
            remove_session("open")
        with pytest.raises(SessionBusyError):
            claim_session("open")
        assert session_path("open").is_file()
    finally:
        holder.kill()
        holder.wait()
    remove_session("open")
    assert not session_path("open").exists()


def test_4_stale_temp_files_of_dead_writers_are_removed(
    tiny: LoadedModel, spinkv_home: Path
) -> None:
    path = saved_chat(tiny, "tmpy", turns=1)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = path.parent / f".{path.name}.{dead.pid}.0123abcd.tmp"
    stale.write_bytes(b"x" * 1000)
    mine_alive = path.parent / f".{path.name}.1.89abcdef.tmp"  # pid 1 is alive: kept
    mine_alive.write_bytes(b"y")
    other = path.parent / f".{path.name}.x.{dead.pid}.0123abcd.tmp"  # another session's shape
    other.write_bytes(b"z")
    saved_chat(tiny, "tmpy", turns=1)
    assert not stale.exists() and mine_alive.exists() and other.exists()


def test_4_killed_save_leaves_nothing_behind_after_the_next_save(
    tiny: LoadedModel, spinkv_home: Path
) -> None:
    """kill -9 while a save is writing its temp file, then save again."""
    path = saved_chat(tiny, "k9", turns=1)
    code = (
        "import os, spinkv, time\n"
        "from spinkv.sessions.store import save_chat, session_path\n"
        f"m = spinkv.load({str(tiny.path)!r})\n"
        "c = m.chat(max_tokens=2); c.ask('x')\n"
        "orig = c.save\n"
        "def slow(p):\n"
        "    orig(p); print('written', flush=True); time.sleep(60)\n"
        "c.save = slow\n"
        "save_chat(c, session_path('k9'))\n"
    )
    child = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env=cli_env()
    )
    assert child.stdout is not None and child.stdout.readline().strip() == "written"
    child.send_signal(signal.SIGKILL)
    child.wait()
    temps = list(path.parent.glob(f".{path.name}.*.tmp"))
    assert len(temps) == 1, "the killed writer left its temp file"
    saved_chat(tiny, "k9", turns=1)
    assert not list(path.parent.glob(f".{path.name}.*.tmp"))


# ---- hangs and memory blow-ups ---------------------------------------------------------------


def test_7_cache_stats_refuses_a_huge_token_count_before_allocating(tiny: LoadedModel) -> None:
    done = spinkv_cli(
        "cache", "stats", "-m", str(tiny.path), "--tokens", "1000000000000", timeout=60
    )
    assert_one_line_error(done, "exceeds the context")


def tiny_gguf(tiny: LoadedModel, tmp_path: Path, **metadata: object) -> Path:
    """The tiny model as a GGUF with some llama.* metadata values replaced."""
    import gguf

    path = write_gguf_from_hf(tiny.path, tmp_path / "src.gguf")
    if not metadata:
        return path
    reader = gguf.GGUFReader(path)
    out = tmp_path / "edited.gguf"
    writer = gguf.GGUFWriter(out, "llama")
    for field in reader.fields.values():
        name = field.name
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        key = name.removeprefix("llama.")
        value = metadata.get(key, field.contents())
        kind = field.types[0]
        if kind == gguf.GGUFValueType.ARRAY:
            writer.add_array(name, value)
        elif key in metadata and isinstance(value, float):
            writer.add_float32(name, value)
        else:
            writer.add_key_value(name, value, kind)
    for tensor in reader.tensors:
        shape = tuple(int(d) for d in reversed(tensor.shape.tolist()))
        writer.add_tensor(tensor.name, tensor.data.reshape(shape))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out


@pytest.mark.parametrize(
    ("key", "value", "fragment"),
    [
        ("block_count", 10**9, "block_count"),
        ("attention.head_count", 0, "head_count"),
        ("context_length", 0, "context_length"),
        ("attention.layer_norm_rms_epsilon", -1.0, "layer_norm_rms_epsilon"),
        ("rope.freq_base", float("nan"), "freq_base"),
        ("tokenizer.ggml.bos_token_id", 1_000_000, "bos_token_id"),
    ],
)
def test_8_15_20_gguf_metadata_is_checked_before_anything_is_sized(
    tiny: LoadedModel, tmp_path: Path, spinkv_home: Path, key: str, value: object, fragment: str
) -> None:
    path = tiny_gguf(tiny, tmp_path, **{key: value})
    started = time.monotonic()
    done = spinkv_cli("models", "import-gguf", str(path), "--name", "bad", timeout=120)
    assert_one_line_error(done, fragment)
    assert time.monotonic() - started < 60
    models = spinkv_home / "models"
    leftovers = list(models.iterdir()) if models.exists() else []
    assert leftovers == [], "a failed import leaves nothing in the store"
    run = spinkv_cli("run", "-m", str(path), "hi", "-n", "2", timeout=120)
    assert_one_line_error(run, fragment)


def test_8_metadata_that_breaks_the_import_is_a_model_error(
    tiny: LoadedModel, tmp_path: Path, spinkv_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whatever a metadata value of the wrong type or range makes the import code raise (here
    a stand-in ValueError) is a ModelFormatError naming the file, and leaves nothing."""
    from spinkv.models import gguf_import

    def broken(*args: object) -> None:
        raise ValueError("invalid literal for int() with base 10: 'x'")

    monkeypatch.setattr(gguf_import, "write_model_dir", broken)
    path = tiny_gguf(tiny, tmp_path)
    with pytest.raises(ModelFormatError, match="cannot be imported: ValueError"):
        gguf_import.import_gguf(path, name="t")
    models = spinkv_home / "models"
    assert not models.exists() or list(models.iterdir()) == []


def test_8_a_killed_import_is_cleaned_up_by_the_next(tiny: LoadedModel, spinkv_home: Path) -> None:
    from spinkv.util.files import temp_dir_for

    models = spinkv_home / "models"
    models.mkdir(parents=True)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = Path(str(temp_dir_for(models / "x")).replace(f"-{os.getpid()}-", f"-{dead.pid}-"))
    stale.mkdir()
    (stale / "model.safetensors").write_bytes(b"half")
    gguf_path = write_gguf_from_hf(tiny.path, spinkv_home / "t.gguf")
    done = spinkv_cli("models", "import-gguf", str(gguf_path), "--name", "t")
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in models.iterdir()) == ["t"]


def test_8_import_gguf_replaces_another_model_only_with_force(
    tiny: LoadedModel, spinkv_home: Path, tmp_path: Path
) -> None:
    first = write_gguf_from_hf(tiny.path, tmp_path / "a.gguf")
    second = write_gguf_from_hf(tiny.path, tmp_path / "b.gguf")
    assert spinkv_cli("models", "import-gguf", str(first), "--name", "t").returncode == 0
    refused = spinkv_cli("models", "import-gguf", str(second), "--name", "t")
    assert_one_line_error(refused, "already holds a model named 't'")
    record = json.loads((spinkv_home / "models" / "t" / "spinkv.json").read_text())
    assert record["source"]["path"] == str(first.resolve())
    forced = spinkv_cli("models", "import-gguf", str(second), "--name", "t", "--force")
    assert forced.returncode == 0, forced.stderr
    record = json.loads((spinkv_home / "models" / "t" / "spinkv.json").read_text())
    assert record["source"]["path"] == str(second.resolve())


def test_8_sigterm_during_an_import_leaves_no_temp_directory(
    tiny: LoadedModel, spinkv_home: Path, tmp_path: Path
) -> None:
    gguf_path = write_gguf_from_hf(tiny.path, tmp_path / "t.gguf")
    code = (
        "import sys, time\n"
        "import spinkv.models.gguf_import as g\n"
        "real = g.write_model_dir\n"
        "def slow(*a, **k):\n"
        "    real(*a, **k); print('filled', flush=True); time.sleep(60)\n"
        "g.write_model_dir = slow\n"
        "from spinkv.cli.app import main\n"
        f"sys.argv = ['spinkv', 'models', 'import-gguf', {str(gguf_path)!r}, '--name', 't']\n"
        "main()\n"
    )
    child = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env=cli_env()
    )
    assert child.stdout is not None and child.stdout.readline().strip() == "filled"
    child.send_signal(signal.SIGTERM)
    assert child.wait(timeout=30) == 128 + signal.SIGTERM
    assert list((spinkv_home / "models").iterdir()) == []


@pytest.mark.parametrize("threads", ["1000000", "99999999999", "0", "-3"])
def test_9_threads_are_bounded_by_the_cli(tiny: LoadedModel, threads: str) -> None:
    done = spinkv_cli("run", "hi", "-m", str(tiny.path), "-t", threads, "-n", "3", timeout=60)
    assert_one_line_error(done, "threads")


def test_10_a_fifo_in_the_sessions_directory_does_not_hang(spinkv_home: Path) -> None:
    sessions = spinkv_home / "sessions"
    sessions.mkdir(parents=True)
    os.mkfifo(sessions / "fz.spkv")
    listed = spinkv_cli("sessions", "list", "--json", timeout=30)
    assert listed.returncode == 0, listed.stderr
    rows = json.loads(listed.stdout)
    assert rows[0]["name"] == "fz" and "FIFO" in rows[0]["error"]
    assert_one_line_error(spinkv_cli("sessions", "show", "fz", timeout=30), "FIFO")


def test_10_fifo_export_and_chat_do_not_hang(tiny: LoadedModel, spinkv_home: Path) -> None:
    sessions = spinkv_home / "sessions"
    sessions.mkdir(parents=True)
    os.mkfifo(sessions / "fz.spkv")
    assert_one_line_error(spinkv_cli("sessions", "export", "fz", timeout=30), "FIFO")
    chat = spinkv_cli("chat", "-m", str(tiny.path), "--session", "fz", stdin="hi\n", timeout=60)
    assert_one_line_error(chat, "FIFO")


def template_copy(tiny: LoadedModel, tmp_path: Path, template: str) -> Path:
    import shutil

    copy = tmp_path / "templated"
    shutil.copytree(tiny.path, copy)
    config_path = copy / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["chat_template"] = template
    config_path.write_text(json.dumps(config))
    return copy


@pytest.mark.parametrize(
    ("template", "fragment"),
    [
        ("{{ 'x' * 100000000 }}", "stopped"),
        ("{{ 1 // 0 }}", "ZeroDivisionError"),
        ("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}", "RecursionError"),
        ("{% for i in range(10**12) %}x{% endfor %}", "Range too big"),
        ("{% for i in range(99999) %}{% for j in range(99999) %}{% endfor %}{% endfor %}", "5 s"),
        ("{{ 9 ** 99999999 }}", "stopped"),
        # One operation that allocates gigabytes before any size check (the address-space
        # bound): a format width, a string doubled thirty times, a replace that grows it.
        ("{{ '%1500000000s' % 'x' }}", "MemoryError"),
        (
            "{% set ns = namespace(s='x') %}{% for i in range(31) %}"
            "{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s|length }}",
            "MemoryError",
        ),
        (
            "{% set ns = namespace(s='x') %}{% for i in range(9) %}"
            "{% set ns.s = ns.s|replace('x', 'xxxxxxxxxx') %}{% endfor %}{{ ns.s|length }}",
            "MemoryError",
        ),
    ],
)
def test_11_14_hostile_chat_templates_are_bounded(
    tiny: LoadedModel, tmp_path: Path, template: str, fragment: str
) -> None:
    copy = template_copy(tiny, tmp_path, template)
    started = time.monotonic()
    done = spinkv_cli("run", "hi", "-m", str(copy), "-n", "2", timeout=60)
    assert_one_line_error(done, "chat template", fragment)
    assert time.monotonic() - started < 30


def test_11_a_template_bounded_in_a_worker_thread_too(tiny: LoadedModel) -> None:
    from spinkv.chat_template import ChatTemplate

    outcome: list[BaseException] = []

    def render() -> None:
        try:
            ChatTemplate("{{ 'x' * 100000000 }}").render([{"role": "user", "content": "hi"}])
        except BaseException as exc:  # noqa: BLE001 - collected for the assertion
            outcome.append(exc)

    worker = threading.Thread(target=render)
    worker.start()
    worker.join(timeout=30)
    assert outcome and isinstance(outcome[0], InvalidInputError)


def test_12_invalid_utf8_in_argv_and_stdin(tiny: LoadedModel) -> None:
    argv = subprocess.run(
        [sys.executable, "-m", "spinkv", "run", "-m", str(tiny.path), "-n", "2", b"hi \xff there"],
        capture_output=True,
        env=cli_env(),
        timeout=120,
    )
    assert argv.returncode == 0, argv.stderr
    piped = subprocess.run(
        [sys.executable, "-m", "spinkv", "run", "-m", str(tiny.path), "-n", "2", "-"],
        input=b"hi \xff there",
        capture_output=True,
        env=cli_env(),
        timeout=120,
    )
    assert piped.returncode == 0, piped.stderr


def test_12_invalid_utf8_in_arguments_is_saved_as_u_fffd(
    tiny: LoadedModel, spinkv_home: Path, tmp_path: Path
) -> None:
    """The system prompt and the prompt of a saved turn, given as bytes that are not UTF-8,
    reach the session file as U+FFFD: the save used to fail on the lone surrogates."""
    common = [sys.executable, "-m", "spinkv"]
    chat = subprocess.run(
        [*common, "chat", "-m", str(tiny.path), "-q", "-n", "2", "--session", "bytes"]
        + ["-s", b"a\xffb"],
        input=b"hi\n",
        capture_output=True,
        env=cli_env(),
        timeout=120,
    )
    assert chat.returncode == 0, chat.stderr
    assert transcript_of(session_path("bytes")).system == "a\ufffdb"
    cache = tmp_path / "pc.spkv"
    run = subprocess.run(
        [*common, "run", "-m", str(tiny.path), "-n", "2", "--prompt-cache", str(cache)]
        + [b"x\xffy"],
        capture_output=True,
        env=cli_env(),
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    assert "x\ufffdy" in transcript_of(cache).messages[0]["content"]


def transcript_of(path: Path) -> Transcript:
    from spinkv.sessions.store import read_transcript

    return read_transcript(path)[0]


def test_12_a_transcript_with_lone_surrogates_reads_as_u_fffd() -> None:
    record = {
        "format": "spinkv-transcript",
        "version": 1,
        "system": "s\ud800",
        "messages": [{"role": "user", "content": "a\udcffb"}],
    }
    transcript = Transcript.from_json(json.dumps(record))
    assert transcript.system == "s\ufffd"
    assert transcript.messages[0]["content"] == "a\ufffdb"
    transcript.to_json().encode("utf-8")


@pytest.mark.parametrize(
    ("kv", "fragment"),
    [
        ({"preset": "turbo", "k_bits": "lots"}, "k_bits must be a number"),
        ({"preset": ["turbo"]}, "preset must be a string"),
        ({"preset": "turbo", "window": 1.5}, "window must be an integer"),
    ],
)
def test_12_kv_options_of_the_wrong_type_are_input_errors(
    tiny: LoadedModel, kv: dict[str, object], fragment: str
) -> None:
    with pytest.raises(InvalidInputError, match=fragment):
        tiny.chat(kv=kv)


def test_12_a_system_prompt_longer_than_the_context_is_refused_at_once(
    tiny: LoadedModel,
) -> None:
    from spinkv.errors import ContextOverflowError

    long = "word " * 2000
    with pytest.raises(ContextOverflowError, match="system prompt is"):
        tiny.chat(system=long)
    chat = tiny.chat()
    with pytest.raises(ContextOverflowError, match="system prompt is"):
        chat.set_system(long)
    done = spinkv_cli("chat", "-m", str(tiny.path), "-n", "2", "-s", long, stdin="hi\n")
    assert_one_line_error(done, "system prompt is")


def test_12_one_bad_line_does_not_end_the_chat(tiny: LoadedModel) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "spinkv", "chat", "-m", str(tiny.path), "-n", "2"],
        input=b"hello \xff\xfe\n/stats\nsecond line\n",
        capture_output=True,
        env=cli_env(),
        timeout=120,
    )
    errors = done.stderr.decode()
    assert done.returncode == 0, errors
    assert errors.count("prefill") == 2, "both messages were answered"
    assert "Traceback" not in errors and "unexpected" not in errors


@pytest.mark.parametrize(
    "flag",
    [
        ["--top-k", "9223372036854775808"],
        ["--repeat-last-n", "100000000000000000000"],
        ["--top-k", "-1"],
    ],
)
def test_13_huge_integers_are_one_line_errors(tiny: LoadedModel, flag: list[str]) -> None:
    done = spinkv_cli("run", "hi", "-m", str(tiny.path), "-n", "2", *flag)
    assert_one_line_error(done, flag[0].removeprefix("--").replace("-", "_"))


def test_16_deeply_nested_transcript_json(tiny: LoadedModel, spinkv_home: Path) -> None:
    good = saved_chat(tiny, "good", turns=1)
    chat = tiny.chat(max_tokens=2)
    nested = "[" * 100000 + "]" * 100000
    session = chat.session
    bad = session_path("deep")
    session.save(str(bad), nested, tiny.identity_extra)
    listed = spinkv_cli("sessions", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    rows = {row["name"]: row for row in json.loads(listed.stdout)}
    assert rows["good"]["error"] is None and "nested too deeply" in rows["deep"]["error"]
    for command in (["show", "deep"], ["export", "deep"]):
        assert_one_line_error(spinkv_cli("sessions", *command), "nested too deeply")
    chat_run = spinkv_cli("chat", "-m", str(tiny.path), "--session", "deep", stdin="hi\n")
    assert_one_line_error(chat_run, "nested too deeply")
    assert good.is_file()


def test_17_python_api_errors_are_spinkv_errors(tiny: LoadedModel) -> None:
    assert issubclass(spinkv.ContextOverflowError, spinkv.SpinkvError)
    chat = tiny.chat(max_tokens=2)
    with pytest.raises(InvalidInputError, match="system prompt"):
        chat.set_system(5)  # type: ignore[arg-type]
    assert chat.ask("still fine").finish_reason in ("stop", "length")
    with pytest.raises(InvalidInputError, match="top_k"):
        spinkv.SamplingParams(top_k=2**70)
    with pytest.raises(InvalidInputError, match="outside the vocabulary"):
        tiny.detokenize([-1])
    with pytest.raises(InvalidInputError, match="prompt must be"):
        tiny.generate(None)  # type: ignore[arg-type]
    stats = chat.stats()
    assert stats["cache"]["total"]["allocated_bytes"] > 0  # what the README shows


def test_17_a_chat_shared_between_threads_takes_turns(tiny: LoadedModel) -> None:
    chat = tiny.chat(max_tokens=3)
    run_on_threads(lambda i: chat.ask(f"thread {i}"), 4, timeout=120)
    assert chat.stats()["turns"] == 4


def test_17_send_from_a_second_thread_is_refused_clearly(tiny: LoadedModel) -> None:
    chat = tiny.chat(max_tokens=3)
    stream = chat.send("first")
    outcome: list[BaseException] = []

    def intrude() -> None:
        try:
            chat.send("second")
        except BaseException as exc:  # noqa: BLE001 - collected for the assertion
            outcome.append(exc)

    intruder = threading.Thread(target=intrude)
    intruder.start()
    intruder.join(timeout=30)
    assert outcome and isinstance(outcome[0], ChatBusyError)
    assert "one turn at a time" in str(outcome[0])
    stream.read_all()
    assert chat.send("third").read_all().finish_reason in ("stop", "length")


def test_19_session_name_with_a_newline_is_refused(spinkv_home: Path, tiny: LoadedModel) -> None:
    done = spinkv_cli("chat", "-m", str(tiny.path), "--session", "nl\n", stdin="hi\n")
    assert_one_line_error(done, "invalid session name")
    assert not (spinkv_home / "sessions").exists() or not any((spinkv_home / "sessions").iterdir())


def test_20_session_links_to_devices_and_nowhere(spinkv_home: Path) -> None:
    sessions = spinkv_home / "sessions"
    sessions.mkdir(parents=True)
    (sessions / "zero.spkv").symlink_to("/dev/zero")
    (sessions / "gone.spkv").symlink_to(sessions / "missing-target.spkv")
    assert_one_line_error(spinkv_cli("sessions", "show", "zero"), "character device")
    assert_one_line_error(spinkv_cli("sessions", "show", "gone"), "dangling symbolic link")


def test_20_spinkv_isa_the_cpu_lacks_is_an_error(tiny: LoadedModel) -> None:
    done = spinkv_cli("run", "hi", "-m", str(tiny.path), "-n", "2", SPINKV_ISA="neon")
    assert_one_line_error(done, "SPINKV_ISA neon")


def test_20_weights_path_that_is_a_directory(tiny: LoadedModel, tmp_path: Path) -> None:
    import shutil

    copy = tmp_path / "dirweights"
    shutil.copytree(tiny.path, copy)
    (copy / "model.safetensors").unlink()
    (copy / "model.safetensors").mkdir()
    done = spinkv_cli("run", "hi", "-m", str(copy), "-n", "2")
    assert_one_line_error(done, "not a regular file")


def test_20_session_file_readers_refuse_non_regular_files(tmp_path: Path) -> None:
    from spinkv.util.files import require_regular_file

    with pytest.raises(SessionFileError, match="a directory"):
        require_regular_file(tmp_path, "session file")


# ---- first use -------------------------------------------------------------------------------


def test_version_flag() -> None:
    done = spinkv_cli("--version")
    assert done.returncode == 0 and done.stdout.strip() == f"spinkv {spinkv.__version__}"


def test_help_shows_flags_without_a_value_type() -> None:
    done = spinkv_cli("run", "--help", COLUMNS="200")
    assert done.returncode == 0
    assert "<bool>" not in done.stdout and "--json" in done.stdout and ".gguf" in done.stdout


def test_importing_a_gguf_on_run_says_what_was_added(
    tiny: LoadedModel, spinkv_home: Path, tmp_path: Path
) -> None:
    gguf_path = write_gguf_from_hf(tiny.path, tmp_path / "added.gguf")
    done = spinkv_cli("run", "-m", str(gguf_path), "hi", "-n", "2")
    assert done.returncode == 0, done.stderr
    assert "added added to the model store" in done.stderr
    assert "spinkv models rm added" in done.stderr
    assert done.stderr.strip().splitlines()[-1].startswith("import ")
    again = spinkv_cli("run", "-m", str(gguf_path), "hi", "-n", "2")
    assert "added" not in again.stderr and not again.stderr.strip().startswith("import")


def test_greedy_is_exact_and_the_default_samples(tiny: LoadedModel) -> None:
    from spinkv.sampling import CHAT_DEFAULTS, sampling_with

    assert sampling_with({"temperature": 0}).repetition_penalty == 1.0
    assert sampling_with({"temperature": 0, "repetition_penalty": 1.3}).repetition_penalty == 1.3
    assert sampling_with({}) == CHAT_DEFAULTS and CHAT_DEFAULTS.temperature > 0
    greedy = ["run", "hi there", "-m", str(tiny.path), "-n", "12", "--json", "--temperature", "0"]
    one, two = (json.loads(spinkv_cli(*greedy).stdout)["text"] for _ in range(2))
    assert one == two == tiny.generate("hi there", max_tokens=12).text


def test_tables_are_not_truncated_when_columns_are_given(tiny: LoadedModel) -> None:
    args = ["bench", "-m", str(tiny.path), "-p", "8", "-n", "4", "-d", "16", "-r", "2"]
    args += ["--kv", "fp16,turbo"]  # mean ± std cells: the widest table
    done = spinkv_cli(*args, COLUMNS="300")
    assert done.returncode == 0, done.stderr
    assert "…" not in done.stdout


def test_word_wrapper_breaks_between_words() -> None:
    from spinkv.cli.render import WordWrapper

    out: list[str] = []
    wrap = WordWrapper(20, out.append)
    for piece in ["What br", "ings you here today? I ", "hope the weather is fine."]:
        wrap(piece)
    wrap.flush()
    lines = "".join(out).split("\n")
    assert all(len(line) <= 20 for line in lines), lines
    assert "".join(out).replace("\n", " ").split() == (
        ["What", "brings", "you", "here", "today?", "I", "hope", "the", "weather", "is", "fine."]
    )


def test_stats_in_chat_has_readable_labels(tiny: LoadedModel) -> None:
    done = spinkv_cli("chat", "-m", str(tiny.path), "-n", "2", stdin="hi\n/stats\n")
    assert done.returncode == 0, done.stderr
    assert "compression vs fp16" in done.stderr and "compression_vs_fp16" not in done.stderr
    assert "sliding_window" not in done.stderr and "when full" in done.stderr


def test_export_json_names_the_default_preset(tiny: LoadedModel, spinkv_home: Path) -> None:
    saved_chat(tiny, "kvdefault", turns=1)
    record = json.loads(spinkv_cli("sessions", "export", "kvdefault", "-f", "json").stdout)
    assert record["kv"]["preset"] == "turbo"
    legacy = Transcript(messages=[], kv=None)
    assert legacy.preset == "turbo"


def test_export_to_a_file_never_replaces_a_session(
    tiny: LoadedModel, spinkv_home: Path, tmp_path: Path
) -> None:
    path = saved_chat(tiny, "kept", turns=1)
    before = path.read_bytes()
    refused = spinkv_cli("sessions", "export", "kept", "-o", str(path))
    assert_one_line_error(refused, "is a spinkv session file")
    assert path.read_bytes() == before
    exports = tmp_path / "exports"
    exports.mkdir()
    assert_one_line_error(
        spinkv_cli("sessions", "export", "kept", "-o", str(exports)), "not a regular file"
    )
    out = exports / "kept.md"
    out.write_text("an older export")
    done = spinkv_cli("sessions", "export", "kept", "-o", str(out))
    assert done.returncode == 0, done.stderr
    assert out.read_text().startswith("# kept")
    assert sorted(p.name for p in exports.iterdir()) == ["kept.md"]  # no lock or temp file


def test_every_store_name_rule_is_one_rule() -> None:
    from spinkv.util.names import check_name

    for bad in ("", ".", "..", "nl\n", "a/b", "-x", "x" * 101):
        with pytest.raises(SpinkvError):
            check_name(bad, "model")
    assert check_name("smollm2-135m.v1_x", "model") == "smollm2-135m.v1_x"


def test_template_errors_are_model_format_errors(tiny: LoadedModel) -> None:
    from spinkv.chat_template import ChatTemplate

    with pytest.raises(ModelFormatError, match="ZeroDivisionError"):
        ChatTemplate("{{ 1 // 0 }}").render([{"role": "user", "content": "x"}])


def test_readme_python_example_runs(default_model_dir: Path) -> None:
    """The README's Python API block, as written (it once named a stats key that did not
    exist)."""
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    block = readme.split("```python\n", 1)[1].split("```", 1)[0]
    block = block.replace("spinkv.load()", f"spinkv.load({str(default_model_dir)!r})")
    exec(compile(block, "README.md", "exec"), {})  # noqa: S102 - our own documentation
