"""The `spinkv` command end to end: real processes, the real runtime, real model files.

Every bad input must give one line on stderr, exit code 2 and no traceback or panic.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import spinkv
from helpers import assert_one_line_error, cli_env, spinkv_cli
from spinkv.chat.command import parse_command, read_message
from spinkv.cli.failures import describe
from spinkv.errors import InvalidInputError


@pytest.fixture(scope="module")
def tiny(native: ModuleType, make_tiny: Callable[..., Path]) -> Path:
    return make_tiny()


def broken_copy(src: Path, dst: Path, **config: Any) -> Path:
    shutil.copytree(src, dst)
    if config:
        path = dst / "config.json"
        path.write_text(json.dumps({**json.loads(path.read_text()), **config}))
    return dst


# ---- chat input parsing (pure) -----------------------------------------------------------


def _lines(*lines: str) -> Callable[[str], str]:
    feed = iter(lines)

    def read_line(prompt: str) -> str:
        try:
            return next(feed)
        except StopIteration:
            raise EOFError from None

    return read_line


def test_read_message_single_line() -> None:
    assert read_message(_lines("hello there")) == "hello there"


def test_read_message_triple_quoted_block() -> None:
    reader = _lines('"""first line', "second line", 'third"""', "next")
    assert read_message(reader) == "first line\nsecond line\nthird"
    assert read_message(reader) == "next"


def test_read_message_block_on_one_line_and_bare_quotes() -> None:
    assert read_message(_lines('"""all in one"""')) == "all in one"
    assert read_message(_lines('"""', "a", "b", '"""')) == "a\nb"


def test_read_message_block_cut_by_end_of_input() -> None:
    with pytest.raises(EOFError):
        read_message(_lines('"""never closed', "more"))


def test_parse_command() -> None:
    assert parse_command("/system  Be brief. ") == ("/system", "Be brief.")
    assert parse_command("/STATS") == ("/stats", "")
    assert parse_command("hello /clear") is None
    assert parse_command("//not a command") is None


def test_describe_errors_in_one_line() -> None:
    error = FileNotFoundError(2, "No such file or directory", "/nope/config.json")
    assert describe(error) == "No such file or directory: /nope/config.json"
    assert describe(InvalidInputError("bad\nthing")) == "bad thing"


# ---- run ---------------------------------------------------------------------------------


def test_help() -> None:
    done = spinkv_cli("--help")
    assert done.returncode == 0
    for command in ("run", "chat", "models"):
        assert command in done.stdout


def test_run_streams_text_and_reports_timings(tiny: Path) -> None:
    done = spinkv_cli("run", "hello there", "--model", str(tiny), "-n", "8")
    assert done.returncode == 0, done.stderr
    assert done.stdout.endswith("\n")
    timing = done.stderr.strip().splitlines()[-1]
    for field in ("load", "tokenize", "prefill", "first token", "decode", "sampling", "threads"):
        assert field in timing, timing
    assert spinkv._native.isa() in timing


def test_run_json_record(tiny: Path) -> None:
    done = spinkv_cli("run", "hello there", "--model", str(tiny), "-n", "8", "--json")
    assert done.returncode == 0, done.stderr
    record = json.loads(done.stdout)
    assert set(record) >= {
        "text",
        "prompt_tokens",
        "completion_tokens",
        "finish_reason",
        "timings",
    }
    assert record["finish_reason"] in ("stop", "length")
    assert record["completion_tokens"] <= 8
    timings = record["timings"]
    assert timings["prefill_tokens"] == record["prompt_tokens"]
    assert timings["isa"] == spinkv._native.isa() and timings["threads"] >= 1
    for key in ("load_ms", "prefill_ms", "first_token_ms", "decode_ms", "sampling_ms"):
        assert timings[key] is not None


def test_run_quiet_prints_only_the_text(tiny: Path) -> None:
    greedy = ["--model", str(tiny), "-n", "8", "--temperature", "0"]
    quiet = spinkv_cli("run", "hello there", *greedy, "--quiet")
    record = json.loads(spinkv_cli("run", "hello there", *greedy, "--json").stdout)
    assert quiet.returncode == 0 and quiet.stderr == ""
    assert quiet.stdout.rstrip("\n") == record["text"].rstrip("\n")


def test_run_verbose_adds_the_runtime_breakdown(tiny: Path) -> None:
    done = spinkv_cli("run", "hello", "--model", str(tiny), "-n", "4", "--verbose")
    assert done.returncode == 0, done.stderr
    for kind in ("attention", "matmul", "other"):
        assert kind in done.stderr


def test_run_reads_stdin(tiny: Path) -> None:
    greedy = ["--model", str(tiny), "-n", "6", "--json", "--temperature", "0"]
    by_argument = spinkv_cli("run", "hello there", *greedy)
    dash = spinkv_cli("run", "-", *greedy, stdin="hello there")
    piped = spinkv_cli("run", *greedy, stdin="hello there")
    expected = json.loads(by_argument.stdout)
    for done in (dash, piped):
        assert done.returncode == 0, done.stderr
        record = json.loads(done.stdout)
        assert record["text"] == expected["text"]
        assert record["prompt_tokens"] == expected["prompt_tokens"]


def test_run_bounds_what_it_reads_of_stdin(monkeypatch: pytest.MonkeyPatch) -> None:
    import io

    from spinkv.chat import run_command
    from spinkv.errors import InvalidInputError

    monkeypatch.setattr(run_command, "MAX_STDIN_CHARS", 100)
    monkeypatch.setattr("sys.stdin", io.StringIO("y\n" * 10_000))
    with pytest.raises(InvalidInputError, match="longer than 100 characters"):
        run_command.read_prompt("-")
    monkeypatch.setattr("sys.stdin", io.StringIO("short"))
    assert run_command.read_prompt("-") == "short"


def test_a_prompt_longer_than_the_context_is_said_to_be(tiny: Path) -> None:
    done = spinkv_cli("run", "--model", str(tiny), "-n", "2", "-", stdin="word " * 400_000)
    assert done.returncode == 2
    assert "more than the context" in done.stderr and "template" not in done.stderr


def test_cache_stats_reads_only_what_its_tokens_need(tiny: Path, tmp_path: Path) -> None:
    big = tmp_path / "big.txt"
    big.write_text("lorem ipsum dolor " * 3_000_000)  # 54 MB
    done = spinkv_cli(
        "cache", "stats", "-m", str(tiny), "--tokens", "8", "--text", str(big), "--json"
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["peak_rss_bytes"] < 400 << 20


def test_run_sampling_flags_and_kv_options_reach_the_runtime(tiny: Path) -> None:
    args = ["run", "hello", "--model", str(tiny), "-n", "8", "--json", "--seed", "3"]
    # A flat distribution (the tiny model's logits are peaked): the settings change the tokens.
    sampled = ["--temperature", "4", "--top-k", "0", "--top-p", "0.99", "--min-p", "0.001"]
    done = spinkv_cli(*args, *sampled, "--repeat-penalty", "1.3", "--repeat-last-n", "16")
    assert done.returncode == 0, done.stderr
    record = json.loads(done.stdout)
    given = spinkv.SamplingParams(
        temperature=4.0,
        top_k=0,
        top_p=0.99,
        min_p=0.001,
        repetition_penalty=1.3,
        repeat_last_n=16,
        seed=3,
    )
    assert record["sampling"] == given.to_dict()
    # The same tokens as the API with those settings, and not those of the defaults.
    model = spinkv.load(tiny)
    assert record["text"] == model.generate("hello", max_tokens=8, sampling=given).text
    default = spinkv.SamplingParams(**{**spinkv.sampling.CHAT_DEFAULTS.to_dict(), "seed": 3})
    assert record["text"] != model.generate("hello", max_tokens=8, sampling=default).text
    fp16 = json.loads(spinkv_cli(*args, "--kv", "fp16", "--kv-page", "16").stdout)
    turbo = json.loads(spinkv_cli(*args, "--kv", "turbo", "--kv-window", "0").stdout)
    assert fp16["kv_cache"]["bit_allocation"] == "fp16"
    assert fp16["kv_cache"]["page_size"] == "16 tokens"
    assert turbo["kv_cache"]["bit_allocation"].startswith("turbo k=3.5")
    assert turbo["kv_cache"]["recent_window"].startswith("window 0 ")


def test_default_model_knows_the_capital_of_france(default_model_dir: Path) -> None:
    # No --model: the default model from the store this test session uses (SPINKV_HOME).
    done = spinkv_cli("run", "What is the capital of France?", "--temperature", "0")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("The capital of France is Paris."), done.stdout


# ---- bad input: one line, exit code 2 ----------------------------------------------------


def test_missing_model_directory(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-model"
    assert_one_line_error(spinkv_cli("run", "hi", "--model", str(missing)), str(missing))


def test_unsupported_architecture(tiny: Path, tmp_path: Path) -> None:
    bert = broken_copy(tiny, tmp_path / "bert", architectures=["BertModel"], model_type="bert")
    assert_one_line_error(spinkv_cli("run", "hi", "--model", str(bert)), "BertModel")


def test_truncated_safetensors(tiny: Path, tmp_path: Path) -> None:
    model = broken_copy(tiny, tmp_path / "truncated")
    weights = model / "model.safetensors"
    os.truncate(weights, weights.stat().st_size // 2)
    assert_one_line_error(spinkv_cli("run", "hi", "--model", str(model)), "safetensors")


def test_corrupted_safetensors_header(tiny: Path, tmp_path: Path) -> None:
    model = broken_copy(tiny, tmp_path / "corrupted")
    with open(model / "model.safetensors", "r+b") as weights:
        weights.seek(8)
        weights.write(b"\x00not json{{{" * 4)
    assert_one_line_error(spinkv_cli("run", "hi", "--model", str(model)), "safetensors")


def test_corrupted_safetensors_header_length(tiny: Path, tmp_path: Path) -> None:
    model = broken_copy(tiny, tmp_path / "bad-length")
    with open(model / "model.safetensors", "r+b") as weights:
        weights.write((2**62).to_bytes(8, "little"))
    assert_one_line_error(spinkv_cli("run", "hi", "--model", str(model)), "safetensors")


@pytest.mark.parametrize("delta", [+100, -100])
def test_vocab_and_embedding_mismatch(tiny: Path, tmp_path: Path, delta: int) -> None:
    vocab = json.loads((tiny / "config.json").read_text())["vocab_size"]
    model = broken_copy(tiny, tmp_path / "vocab", vocab_size=vocab + delta)
    assert_one_line_error(spinkv_cli("run", "hi", "--model", str(model)), str(vocab + delta))


def test_prompt_longer_than_the_context(make_tiny: Callable[..., Path], native: ModuleType) -> None:
    short = make_tiny(max_position_embeddings=48)
    done = spinkv_cli("run", "word " * 200, "--model", str(short))
    assert_one_line_error(done, "context", "48")


@pytest.mark.parametrize(
    ("flag", "value", "name"),
    [
        ("--temperature", "-1", "temperature"),
        ("--top-p", "0", "top_p"),
        ("--top-k", "-3", "top_k"),
        ("--min-p", "1.5", "min_p"),
        ("--repeat-penalty", "0", "repetition_penalty"),
        ("--temperature", "nan", "temperature"),
        ("--temperature", "warm", "--temperature"),
    ],
)
def test_invalid_sampling_values(tiny: Path, flag: str, value: str, name: str) -> None:
    done = spinkv_cli("run", "hi", "--model", str(tiny), f"{flag}={value}")
    assert_one_line_error(done, name)


def test_invalid_run_settings(tiny: Path) -> None:
    assert_one_line_error(spinkv_cli("run", "hi", "--model", str(tiny), "--kv", "nope"), "nope")
    assert_one_line_error(
        spinkv_cli("run", "hi", "--model", str(tiny), "--threads", "0"), "threads"
    )
    for command in (["run", "hi"], ["chat"]):
        done = spinkv_cli(*command, "--model", str(tiny), "-n", "0", stdin="hi\n")
        assert_one_line_error(done, "--max-tokens", "greater than or equal to 1")
    assert_one_line_error(spinkv_cli("run", "--model", str(tiny), stdin="  \n"), "empty")
    assert_one_line_error(spinkv_cli("run", "hi", "--no-such-flag"), "--no-such-flag")
    for threshold in ("1", "-0.5", "nan"):
        done = spinkv_cli("run", "hi", "--model", str(tiny), f"--sparse-v={threshold}")
        assert_one_line_error(done, "sparse_v")


def test_debug_setting_shows_the_traceback(tmp_path: Path) -> None:
    done = spinkv_cli("run", "hi", "--model", str(tmp_path / "nope"), SPINKV_DEBUG="1")
    assert done.returncode == 2
    assert "Traceback" in done.stderr and "error: " in done.stderr


# ---- chat --------------------------------------------------------------------------------


def test_chat_session_with_commands(tiny: Path) -> None:
    script = "\n".join(
        [
            "hello",
            '"""first line',
            'second line"""',
            "/stats",
            "/system Be brief.",
            "third turn",
            "/clear",
            "/stats",
            "/help",
            "/nope",
            "/exit",
            "never read",
        ]
    )
    done = spinkv_cli("chat", "--model", str(tiny), "-n", "6", stdin=script + "\n")
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stdout + done.stderr
    assert "KV cache" in done.stderr
    turns = [
        line.split()[-1] for line in done.stderr.splitlines() if line.strip().startswith("turns")
    ]
    assert turns == ["2", "0"], "the block was one message; /clear forgot everything"
    assert "system prompt: Be brief." in done.stderr
    assert "unknown command /nope" in done.stderr
    assert "/system" in done.stderr  # the help text
    timing_lines = [line for line in done.stderr.splitlines() if "prefill" in line]
    assert len(timing_lines) == 3
    assert "load" in timing_lines[0] and "load" not in timing_lines[1]
    assert "cached" in timing_lines[1], "the second turn reuses the cache"


def test_chat_reports_context_overflow_and_goes_on(
    make_tiny: Callable[..., Path], native: ModuleType
) -> None:
    short = make_tiny(max_position_embeddings=48)
    script = "word " * 100 + "\nhi\n"
    done = spinkv_cli("chat", "--model", str(short), "-n", "4", stdin=script)
    assert done.returncode == 0, done.stderr
    assert "--max-context" in done.stderr and "context" in done.stderr
    assert sum("prefill" in line for line in done.stderr.splitlines()) == 1


def test_a_system_prompt_the_context_refuses_leaves_the_chat_going(tiny: Path) -> None:
    script = "/system " + "word " * 100 + "\nhi\n"
    done = spinkv_cli("chat", "--model", str(tiny), "--max-context", "64", "-n", "4", stdin=script)
    assert done.returncode == 0, done.stderr
    assert "system prompt is" in done.stderr and "context holds 64" in done.stderr
    assert sum("prefill" in line for line in done.stderr.splitlines()) == 1, "hi was answered"


def test_closed_or_broken_stdout(tiny: Path) -> None:
    """stdout closed by the caller: written nowhere, exit 0; a reader that went away: 141."""
    command = [sys.executable, "-m", "spinkv", "run", "--model", str(tiny), "-n", "4", "hi"]
    closed = subprocess.run(
        command,
        stdin=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=cli_env(),
        preexec_fn=lambda: os.close(1),
        timeout=300,
        text=True,
    )
    assert closed.returncode == 0, closed.stderr
    assert "Traceback" not in closed.stderr
    with subprocess.Popen(
        command,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=cli_env(),
    ) as reader_gone:
        assert reader_gone.stdout is not None and reader_gone.stderr is not None
        reader_gone.stdout.close()
        errors = reader_gone.stderr.read().decode()
        assert reader_gone.wait(timeout=300) == 141, errors
    assert "Traceback" not in errors


def test_chat_invalid_options_fail_before_loading(tiny: Path) -> None:
    done = spinkv_cli("chat", "--model", str(tiny), "--top-k", "-3")
    assert_one_line_error(done, "top_k")


class PipeReader:
    """Collects a child's output pipe on a thread, so a test can wait for some text."""

    def __init__(self, pipe: Any) -> None:
        self._pipe = pipe
        self._chunks: list[bytes] = []
        self._thread = threading.Thread(target=self._drain, daemon=True)
        self._thread.start()

    def _drain(self) -> None:
        for chunk in iter(lambda: self._pipe.read1(4096), b""):
            self._chunks.append(chunk)

    @property
    def text(self) -> str:
        return b"".join(self._chunks).decode("utf-8", errors="replace")

    def wait_for(self, predicate: Callable[[str], bool], timeout: float) -> str:
        deadline = time.monotonic() + timeout
        while not predicate(self.text) and time.monotonic() < deadline:
            time.sleep(0.02)
        return self.text

    def close(self) -> str:
        self._thread.join(timeout=30)
        return self.text


class ChatProcess:
    """`spinkv chat` in a child process with its stdin held open."""

    def __init__(self, *args: str) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "spinkv", "chat", *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=cli_env(),
        )
        self.stdout = PipeReader(self.process.stdout)
        self.stderr = PipeReader(self.process.stderr)

    def send(self, text: str) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(text.encode())
        self.process.stdin.flush()

    def interrupt(self) -> None:
        self.process.send_signal(signal.SIGINT)

    def finish(self, text: str = "", timeout: float = 300) -> int:
        """Send the last input, close stdin (Ctrl-D) and wait for the exit code."""
        assert self.process.stdin is not None
        self.process.stdin.write(text.encode())
        self.process.stdin.close()
        code = self.process.wait(timeout=timeout)
        self.stdout.close()
        self.stderr.close()
        return code

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()


def test_ctrl_c_twice_at_the_prompt_leaves(tiny: Path) -> None:
    chat = ChatProcess("--model", str(tiny), "-n", "4")
    try:
        chat.send("hello\n")
        chat.stderr.wait_for(lambda text: "prefill" in text, timeout=60)
        time.sleep(0.5)  # back at the prompt
        chat.interrupt()
        hint = chat.stderr.wait_for(lambda text: "Ctrl-C again" in text, timeout=30)
        assert "Ctrl-C again" in hint
        assert chat.process.poll() is None, "one Ctrl-C at the prompt does not leave"
        chat.interrupt()
        assert chat.process.wait(timeout=30) == 0
    finally:
        chat.kill()
    assert "Traceback" not in chat.stderr.close()


def test_ctrl_c_stops_a_reply_and_keeps_the_conversation(default_model_dir: Path) -> None:
    chat = ChatProcess("--model", str(default_model_dir), "-n", "400", "--temperature", "0")
    try:
        chat.send("Write a very long story about a dragon who learns to cook.\n")
        shown = chat.stdout.wait_for(lambda text: len(text.split()) >= 5, timeout=120)
        assert len(shown.split()) >= 5, "the reply started streaming"
        chat.interrupt()
        stopped = chat.stderr.wait_for(lambda text: "interrupted" in text, timeout=60)
        assert "stopped: interrupted" in stopped
        assert chat.process.poll() is None, "stopping a reply does not leave the chat"
        code = chat.finish("/stats\nWhat is the capital of France?\n")
    finally:
        chat.kill()
    output, errors = chat.stdout.text, chat.stderr.text
    assert code == 0, errors
    assert "Traceback" not in output + errors
    turns = [line.split()[-1] for line in errors.splitlines() if line.strip().startswith("turns")]
    assert turns == ["1"], "the interrupted reply is kept as a turn"
    assert "Paris" in output.split(shown.strip()[-20:], 1)[-1]


# ---- models ------------------------------------------------------------------------------


def test_models_list_and_info(tiny: Path, tmp_path: Path) -> None:
    home = str(tmp_path / "home")
    empty = spinkv_cli("models", "list", "--json", SPINKV_HOME=home)
    assert empty.returncode == 0 and json.loads(empty.stdout) == []
    info = spinkv_cli("models", "info", str(tiny), "--json", SPINKV_HOME=home)
    assert info.returncode == 0, info.stderr
    record = json.loads(info.stdout)
    assert record["n_layers"] == 2 and record["kv_bytes_per_token"] > 0
    table = spinkv_cli("models", "info", str(tiny), SPINKV_HOME=home)
    assert "KV bytes per token" in table.stdout and "parameters" in table.stdout


def test_models_list_and_info_name_what_the_loader_would_refuse(tiny: Path, tmp_path: Path) -> None:
    from safetensors.numpy import load_file, save_file

    home = tmp_path / "home"
    shutil.copytree(tiny, home / "models" / "fine")
    broken = shutil.copytree(tiny, home / "models" / "broken")
    weights = load_file(broken / "model.safetensors")
    del weights["model.layers.1.mlp.up_proj.weight"]
    save_file(weights, broken / "model.safetensors")

    info = spinkv_cli("models", "info", "broken", SPINKV_HOME=str(home))
    assert_one_line_error(info, "model.layers.1.mlp.up_proj.weight", "missing")
    assert_one_line_error(
        spinkv_cli("models", "info", str(broken), "--json", SPINKV_HOME=str(home)),
        "model.layers.1.mlp.up_proj.weight",
    )
    listed = spinkv_cli("models", "list", SPINKV_HOME=str(home))
    assert listed.returncode == 0, listed.stderr
    rows = {line.split()[0]: line for line in listed.stdout.splitlines() if line.strip()}
    assert "broken: tensor model.layers.1.mlp.up_proj.weight is missing" in rows["broken"]
    assert rows["fine"].split()[-1] == "ok" and "broken" not in rows["fine"]
    records = json.loads(spinkv_cli("models", "list", "--json", SPINKV_HOME=str(home)).stdout)
    by_name = {record["name"]: record for record in records}
    assert by_name["fine"]["problem"] is None and by_name["fine"]["n_layers"] == 2
    assert "model.layers.1.mlp.up_proj.weight" in by_name["broken"]["problem"]
    assert by_name["broken"]["n_layers"] is None


def test_models_list_and_info_name_a_tokenizer_run_refuses(tiny: Path, tmp_path: Path) -> None:
    home = tmp_path / "home"
    shutil.copytree(tiny, home / "models" / "fine")
    unparsable = shutil.copytree(tiny, home / "models" / "bad-tokenizer")
    (unparsable / "tokenizer.json").write_text('{"model": 5')
    incomplete = shutil.copytree(tiny, home / "models" / "no-tokenizer")
    (incomplete / "tokenizer.json").unlink()

    listed = spinkv_cli("models", "list", "--json", SPINKV_HOME=str(home))
    assert listed.returncode == 0, listed.stderr
    problems = {record["name"]: record["problem"] for record in json.loads(listed.stdout)}
    assert problems["fine"] is None
    assert "bad-tokenizer/tokenizer.json" in problems["bad-tokenizer"]
    assert "missing tokenizer.json" in problems["no-tokenizer"]
    table = spinkv_cli("models", "list", SPINKV_HOME=str(home))
    assert table.stdout.count("broken: ") == 2, table.stdout
    for name in ("bad-tokenizer", "no-tokenizer"):
        assert_one_line_error(spinkv_cli("models", "info", name, SPINKV_HOME=str(home)), name)
        assert_one_line_error(spinkv_cli("run", "-m", name, "hi", SPINKV_HOME=str(home)), name)


def test_models_list_info_and_rm_of_a_link_in_the_store(tiny: Path, tmp_path: Path) -> None:
    home = tmp_path / "home"
    target = shutil.copytree(tiny, tmp_path / "elsewhere" / "tiny-v2")
    (home / "models").mkdir(parents=True)
    (home / "models" / "mine").symlink_to(target)

    listed = json.loads(spinkv_cli("models", "list", "--json", SPINKV_HOME=str(home)).stdout)
    assert [(r["name"], r["path"], r["problem"]) for r in listed] == [
        ("mine", str(target.resolve()), None)
    ]
    info = spinkv_cli("models", "info", "mine", "--json", SPINKV_HOME=str(home))
    assert info.returncode == 0 and json.loads(info.stdout)["name"] == "mine", info.stderr
    done = spinkv_cli("models", "rm", "mine", SPINKV_HOME=str(home))
    assert done.returncode == 0, done.stderr
    assert f"removed the link {home / 'models' / 'mine'} (its target {target}" in done.stderr
    assert not (home / "models" / "mine").is_symlink()
    assert sorted(p.name for p in target.iterdir()) == sorted(p.name for p in tiny.iterdir())


def test_models_bad_input(tmp_path: Path) -> None:
    home = str(tmp_path / "home")
    assert_one_line_error(spinkv_cli("models", "pull", "no-such-model", SPINKV_HOME=home))
    assert_one_line_error(
        spinkv_cli("models", "import-gguf", str(tmp_path / "x.gguf"), "--dtype", "f8"), "f8"
    )
    assert_one_line_error(spinkv_cli("models", "info", str(tmp_path / "nope"), SPINKV_HOME=home))
