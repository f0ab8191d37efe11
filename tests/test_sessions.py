"""Sessions and cache identity: save/restore with KV pages, identity refusal, damaged files,
prompt caches, atomic writes under concurrency, cancellation-safe rollback, sliding window.

Everything runs on the tiny random model; the soak test is benches/session_soak.py.
"""

from __future__ import annotations

import _thread
import json
import random
import shutil
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
from spinkv.api import ChatSession, LoadedModel
from spinkv.errors import InvalidInputError
from spinkv.generation import TextStream
from spinkv.sessions.store import (
    Transcript,
    check_name,
    restore_chat,
    save_chat,
    session_path,
)

TURBO_SMALL = {"preset": "turbo", "window": 16, "page_tokens": 8}
"""Small pages and window: a few dozen tokens exercise sealing inside a turn."""


@pytest.fixture(scope="module")
def tiny(native: ModuleType, make_tiny: Callable[..., Path]) -> LoadedModel:
    return spinkv.load(make_tiny())


@pytest.fixture(scope="module")
def other_tiny(native: ModuleType, make_tiny: Callable[..., Path]) -> LoadedModel:
    return spinkv.load(make_tiny(seed=1))


def chat_with_history(model: LoadedModel, kv: Any = TURBO_SMALL, turns: int = 2) -> ChatSession:
    chat = model.chat(kv=kv, max_tokens=12)
    for i in range(turns):
        chat.ask(f"Hello world number {i}. What is the capital of France?")
    return chat


def digest(chat: ChatSession) -> str:
    return str(chat.session.state_digest())


# ---- save and restore ---------------------------------------------------------------------


def test_restore_rebuilds_the_exact_cache_and_goes_on_identically(
    tiny: LoadedModel, tmp_path: Path
) -> None:
    chat = chat_with_history(tiny)
    assert chat.stats()["cache"]["total"]["compressed_tokens"] > 0, "compressed pages saved"
    path = tmp_path / "a.spkv"
    size = chat.save(path)
    assert size == path.stat().st_size > 0

    again = tiny.chat(kv=TURBO_SMALL, max_tokens=12)
    outcome = again.restore(path)
    assert outcome.reused and outcome.turns == 2
    assert outcome.cached_tokens == chat.cached_tokens
    assert digest(again) == digest(chat)
    assert again.history == chat.history and again.system == chat.system
    one, two = chat.ask("And Italy?"), again.ask("And Italy?")
    assert one.text == two.text and one.token_ids == two.token_ids
    assert two.cached_tokens > 0
    assert digest(again) == digest(chat)


def test_the_identity_record_has_every_field(tiny: LoadedModel) -> None:
    identity = dict(tiny.chat().session.identity(tiny.identity_extra))
    assert list(identity)[:13] == [
        "cache_format_version",
        "model_hash",
        "tokenizer_hash",
        "chat_template_hash",
        "shape",
        "transform",
        "codebook_version",
        "bit_allocation",
        "outlier_policy",
        "recent_window",
        "page_size",
        "context_digest",
        "runtime_build",
    ]
    assert identity["model_hash"] == tiny.native.content_hash()
    assert identity["tokenizer_hash"] == tiny.identity_extra["tokenizer_hash"]
    assert identity["runtime_build"].startswith("spinkv ")


def test_sparse_values_are_a_way_of_reading_not_part_of_the_identity(
    tiny: LoadedModel, tmp_path: Path
) -> None:
    chat = chat_with_history(tiny)
    chat.save(tmp_path / "a.spkv")
    reader = tiny.chat(kv={**TURBO_SMALL, "sparse_v": 0.0}, max_tokens=12)
    outcome = reader.restore(tmp_path / "a.spkv")
    assert outcome.reused and outcome.cached_tokens == chat.cached_tokens
    assert digest(reader) == digest(chat)


@pytest.mark.parametrize(
    ("kv", "expected"),
    [
        ("fp16", ["transform", "codebook_version", "bit_allocation", "outlier_policy"]),
        ({**TURBO_SMALL, "window": 32}, ["recent_window"]),
        ({**TURBO_SMALL, "k_bits": 4.0}, ["bit_allocation"]),
        ({**TURBO_SMALL, "seed": 7}, ["transform"]),
        ({**TURBO_SMALL, "page_tokens": 16}, ["page_size"]),
    ],
)
def test_another_preset_is_refused_by_name_and_the_transcript_survives(
    tiny: LoadedModel, tmp_path: Path, kv: Any, expected: list[str]
) -> None:
    chat = chat_with_history(tiny)
    chat.save(tmp_path / "a.spkv")
    other = tiny.chat(kv=kv, max_tokens=12)
    outcome = other.restore(tmp_path / "a.spkv")
    assert not outcome.reused
    assert all(field in outcome.fields for field in expected), outcome.fields
    assert all(field in (outcome.reason or "") for field in expected)
    assert other.history == chat.history, "the transcript is adopted"
    assert other.cached_tokens == 0
    result = other.ask("And Italy?")
    assert result.cached_tokens == 0 and other.cached_tokens > 0, "re-prefilled from the transcript"


def test_another_model_is_refused_and_the_conversation_goes_on(
    tiny: LoadedModel, other_tiny: LoadedModel, tmp_path: Path
) -> None:
    chat = chat_with_history(tiny)
    chat.save(tmp_path / "a.spkv")
    moved = other_tiny.chat(kv=TURBO_SMALL, max_tokens=12)
    outcome = moved.restore(tmp_path / "a.spkv")
    assert not outcome.reused and outcome.fields == ["model_hash"]
    # Re-prefilling the transcript gives exactly what a fresh conversation would.
    fresh = other_tiny.chat(kv=TURBO_SMALL, max_tokens=12)
    fresh._history = chat.history  # the same conversation, never cached
    assert moved.ask("And Italy?").text == fresh.ask("And Italy?").text


# ---- damaged files ------------------------------------------------------------------------


def damage(kind: str, good: bytes, path: Path) -> None:
    if path.exists():
        path.unlink()
    data = bytearray(good)
    if kind == "truncated":
        path.write_bytes(good[: len(good) // 2])
    elif kind == "flipped-page-byte":
        data[-200] ^= 0x01
        path.write_bytes(bytes(data))
    elif kind == "flipped-header-byte":
        data[90] ^= 0x01
        path.write_bytes(bytes(data))
    elif kind == "wrong-magic":
        data[:8] = b"GGUFxxxx"
        path.write_bytes(bytes(data))
    elif kind == "future-version":
        data[8] = 2
        path.write_bytes(bytes(data))
    elif kind == "empty":
        path.write_bytes(b"")
    elif kind == "directory":
        path.mkdir()
    else:
        raise AssertionError(kind)


UNREADABLE = {
    "truncated": "truncated",
    "flipped-header-byte": "corrupt",
    "wrong-magic": "not a spinkv session file",
    "future-version": "newer spinkv",
    "empty": "empty",
    "directory": "directory",
}


@pytest.mark.parametrize("kind", [*UNREADABLE, "flipped-page-byte"])
def test_damaged_files_get_one_clear_error_and_change_nothing(
    tiny: LoadedModel, tmp_path: Path, kind: str, native: ModuleType
) -> None:
    good = tmp_path / "good.spkv"
    chat_with_history(tiny).save(good)
    bad = tmp_path / "bad.spkv"
    damage(kind, good.read_bytes(), bad)
    before = bad.read_bytes() if bad.is_file() else None

    victim = chat_with_history(tiny, turns=1)
    state, history = digest(victim), victim.history
    if kind in UNREADABLE:
        with pytest.raises(native.SessionFileError, match=UNREADABLE[kind]):
            victim.restore(bad)
        assert victim.history == history, "the live conversation is untouched"
    else:
        outcome = victim.restore(bad)
        assert not outcome.reused and "damaged KV pages" in (outcome.reason or "")
        assert victim.history == chat_with_history(tiny).history, "the transcript survives"
    if kind in UNREADABLE:
        assert digest(victim) == state, "the live cache is untouched"
    assert (bad.read_bytes() if bad.is_file() else None) == before, "the file is left alone"


@pytest.mark.parametrize("kind", [*UNREADABLE, "flipped-page-byte"])
def test_cli_reports_damaged_sessions_in_one_line(
    tiny: LoadedModel, spinkv_home: Path, kind: str
) -> None:
    path = session_path("bad")
    save_chat(chat_with_history(tiny), path)
    damage(kind, path.read_bytes(), path)
    before = path.read_bytes() if path.is_file() else None
    done = spinkv_cli("sessions", "show", "bad")
    fragment = UNREADABLE.get(kind, "damaged KV pages")
    assert_one_line_error(done, "bad.spkv", fragment)
    if kind == "flipped-page-byte":
        assert "intact" in done.stderr, "says the transcript survives"
        exported = spinkv_cli("sessions", "export", "bad", "--format", "json")
        assert exported.returncode == 0, exported.stderr
        assert len(json.loads(exported.stdout)["messages"]) == 4
    else:
        chat = spinkv_cli("chat", "--session", "bad", stdin="hi\n")
        assert_one_line_error(chat, "bad.spkv", fragment)
    assert (path.read_bytes() if path.is_file() else None) == before


# ---- the chat command ---------------------------------------------------------------------


def test_chat_session_is_created_resumed_and_autosaved(
    tiny: LoadedModel, spinkv_home: Path
) -> None:
    model = str(tiny.path)
    done = spinkv_cli(
        "chat",
        "-m",
        model,
        "--kv",
        "turbo",
        "-n",
        "6",
        "--session",
        "s1",
        stdin="hello\nhow are you\n",
    )
    assert done.returncode == 0, done.stderr
    assert "session s1: new" in done.stderr
    listed = json.loads(spinkv_cli("sessions", "list", "--json").stdout)
    assert [(s["name"], s["model"], s["preset"], s["turns"]) for s in listed] == [
        ("s1", tiny.path.name, "turbo", 2)
    ]
    assert listed[0]["tokens"] > 0 and listed[0]["size_bytes"] > 0
    # Resumed without --model/--kv: the session's own settings, its cache reused.
    again = spinkv_cli("chat", "-n", "6", "--session", "s1", stdin="and again\n")
    assert again.returncode == 0, again.stderr
    assert "resumed 2 turns" in again.stderr and "tokens of KV cache reused" in again.stderr
    assert "cached" in [line for line in again.stderr.splitlines() if "prefill" in line][0]
    listed = json.loads(spinkv_cli("sessions", "list", "--json").stdout)
    assert listed[0]["turns"] == 3
    exported = spinkv_cli("sessions", "export", "s1")
    assert exported.stdout.startswith("# s1") and "## User\n\nand again" in exported.stdout
    shown = spinkv_cli("sessions", "show", "s1", "--json")
    identity = json.loads(shown.stdout)["identity"]
    assert "turbo k=3.5" in identity["bit_allocation"]
    # Another preset: refused by name, the conversation goes on from the transcript.
    other = spinkv_cli("chat", "--kv", "fp16", "-n", "6", "--session", "s1", stdin="more\n")
    assert other.returncode == 0, other.stderr
    assert "KV cache not reused" in other.stderr and "bit_allocation" in other.stderr
    assert json.loads(spinkv_cli("sessions", "list", "--json").stdout)[0]["turns"] == 4
    removed = spinkv_cli("sessions", "rm", "s1")
    assert removed.returncode == 0 and not session_path("s1").exists()
    assert_one_line_error(spinkv_cli("sessions", "show", "s1"), "no session named 's1'")


def test_chat_slash_commands_save_load_and_list(tiny: LoadedModel, spinkv_home: Path) -> None:
    model = str(tiny.path)
    script = "hello\n/save\n/save first\nsecond message\n/sessions\n/load first\n/load nope\n"
    done = spinkv_cli("chat", "-m", model, "-n", "4", stdin=script)
    assert done.returncode == 0, done.stderr
    assert "/save needs a name" in done.stderr
    assert "saved session first (1 turns" in done.stderr
    assert "session first: resumed" in done.stderr and "reused" in done.stderr
    assert "no session named 'nope'" in done.stderr
    # Bound by /save: the second message was autosaved into "first" before /load.
    assert json.loads(spinkv_cli("sessions", "list", "--json").stdout)[0]["turns"] == 2
    bad = spinkv_cli("chat", "-m", model, "--session", "../evil", stdin="hi\n")
    assert_one_line_error(bad, "invalid session name")


def test_chat_with_damaged_pages_re_prefills_and_autosave_repairs(
    tiny: LoadedModel, spinkv_home: Path
) -> None:
    path = session_path("s2")
    save_chat(chat_with_history(tiny, kv="turbo"), path)
    damage("flipped-page-byte", path.read_bytes(), path)
    done = spinkv_cli("chat", "-n", "4", "--session", "s2", stdin="next\n")
    assert done.returncode == 0, done.stderr
    assert "damaged KV pages" in done.stderr and "re-prefilled" in done.stderr
    assert spinkv_cli("sessions", "show", "s2").returncode == 0, "the next save repaired it"
    assert json.loads(spinkv_cli("sessions", "list", "--json").stdout)[0]["turns"] == 3


def test_session_names_are_checked() -> None:
    for name in ("ok", "a.b-c_d", "X1"):
        assert check_name(name) == name
    for name in ("", "../x", "a/b", ".hidden", "x" * 101, "a.spkv", "sp ace"):
        with pytest.raises(InvalidInputError):
            check_name(name)


# ---- prompt caches ------------------------------------------------------------------------


def run_json(*args: str) -> dict[str, Any]:
    done = spinkv_cli("run", *args, "--json")
    assert done.returncode == 0, done.stderr
    return dict(json.loads(done.stdout))


def test_prompt_cache_reuses_the_longest_matching_prefix(tiny: LoadedModel, tmp_path: Path) -> None:
    cache = str(tmp_path / "p.spkv")
    common = ["-m", str(tiny.path), "-n", "4", "--kv", "turbo", "--prompt-cache", cache]
    common += ["--temperature", "0"]
    first = run_json(*common, "The capital of France is a city")
    assert first["prompt_cache"]["status"] == "new" and first["cached_tokens"] == 0
    same = run_json(*common, "The capital of France is a city")
    assert same["prompt_cache"]["status"] == "hit"
    assert same["cached_tokens"] == same["prompt_tokens"] - 1
    assert same["text"] == first["text"]
    longer = run_json(*common, "The capital of France is Paris, a large city")
    assert 0 < longer["cached_tokens"] < longer["prompt_tokens"] - 1
    assert longer["prompt_cache"]["reused_tokens"] == longer["cached_tokens"]
    plain = spinkv_cli("run", *common, "The capital of France is Paris, a large city")
    assert "prompt cache: reused" in plain.stderr
    other = run_json(*common[:4], "--kv", "kivi2", *common[6:], "The capital of France")
    assert other["prompt_cache"]["status"] == "refused" and other["cached_tokens"] == 0
    assert "bit_allocation" in other["prompt_cache"]["fields"]


def test_prompt_cache_never_overwrites_a_file_it_cannot_read(
    tiny: LoadedModel, tmp_path: Path
) -> None:
    notes = tmp_path / "notes.txt"
    notes.write_text("my notes, not a cache\n")
    done = spinkv_cli("run", "-m", str(tiny.path), "--prompt-cache", str(notes), "hi")
    assert_one_line_error(done, "not a spinkv session file")
    assert notes.read_text() == "my notes, not a cache\n"
    done = spinkv_cli("run", "-m", str(tiny.path), "--prompt-cache", str(tmp_path), "hi")
    assert_one_line_error(done, "directory")
    done = spinkv_cli("run", "-m", str(tiny.path), "--prompt-cache", "/nonexistent/p.spkv", "hi")
    assert_one_line_error(done, "does not exist")


# ---- concurrency ----------------------------------------------------------------------------

WRITER = """
import sys, spinkv
from spinkv.sessions.store import save_chat, session_path
model = spinkv.load(sys.argv[1])
chat = model.chat(kv="turbo", max_tokens=4)
chat.ask("writer " + sys.argv[2])
for _ in range(int(sys.argv[3])):
    save_chat(chat, session_path("shared"))
"""


def test_two_processes_saving_one_session_never_corrupt_it(
    tiny: LoadedModel, spinkv_home: Path
) -> None:
    env = cli_env(SPINKV_HOME=str(spinkv_home))
    writers = [
        subprocess.Popen(
            [sys.executable, "-c", WRITER, str(tiny.path), name, "25"],
            env=env,
            stderr=subprocess.PIPE,
            text=True,
        )
        for name in ("one", "two")
    ]
    path = session_path("shared")
    seen = 0
    while any(w.poll() is None for w in writers):
        if path.exists():  # readers never see a partial file
            chat = tiny.chat(kv="turbo", max_tokens=4)
            assert restore_chat(chat, path).reused
            seen += 1
        time.sleep(0.01)
    for w in writers:
        assert w.wait() == 0, w.stderr.read() if w.stderr else ""
    chat = tiny.chat(kv="turbo", max_tokens=4)
    assert restore_chat(chat, path).reused
    assert chat.history[0]["content"] in ("writer one", "writer two")
    leftovers = [p.name for p in path.parent.iterdir() if p.name.endswith(".tmp")]
    assert leftovers == [] and seen > 0


# ---- cancellation-safe rollback -------------------------------------------------------------


class InterruptingSession:
    """A native session that raises KeyboardInterrupt right before or after its n-th
    prefill/decode call (as Ctrl-C would surface between two native calls)."""

    def __init__(self, inner: Any, at: int, after: bool) -> None:
        self._inner, self._at, self._after, self.calls = inner, at, after, 0

    def _hit(self, name: str, *args: Any) -> Any:
        self.calls += 1
        if self.calls == self._at and not self._after:
            raise KeyboardInterrupt
        out = getattr(self._inner, name)(*args)
        if self.calls == self._at and self._after:
            raise KeyboardInterrupt
        return out

    def prefill(self, *args: Any) -> Any:
        return self._hit("prefill", *args)

    def decode(self, *args: Any) -> Any:
        return self._hit("decode", *args)

    def __len__(self) -> int:
        return len(self._inner)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def test_ctrl_c_at_every_native_call_leaves_the_cache_as_before(
    tiny: LoadedModel, tmp_path: Path
) -> None:
    kv = {**TURBO_SMALL, "max_context": 96}
    base = chat_with_history(tiny, kv=kv)
    base.save(tmp_path / "base.spkv")
    prompt = base.messages + [{"role": "user", "content": "Tell me about tokens " * 6}]
    probe = tiny.chat(kv=kv)
    probe.restore(tmp_path / "base.spkv")
    prompt_ids = tiny.tokenize(tiny.render_chat(prompt))

    def stream(session: Any) -> TextStream:
        spec = tiny.turn_spec(prompt_ids, None, 40, kv, tiny.new_timings(), slide=True)
        return TextStream(session, spec)

    counter = InterruptingSession(probe.session, at=-1, after=False)
    stream(counter).read_all()
    assert counter.calls > 10 and probe.session.retired > 0, "seals and slides in the turn"
    for at in range(1, counter.calls + 1):
        for after in (False, True):
            chat = tiny.chat(kv=kv)
            chat.restore(tmp_path / "base.spkv")
            before = digest(chat)
            with pytest.raises(KeyboardInterrupt):
                stream(InterruptingSession(chat.session, at, after)).read_all()
            assert digest(chat) == before, f"interrupted {'after' if after else 'at'} call {at}"


def test_ctrl_c_at_random_moments_leaves_the_cache_as_before(
    native: ModuleType, make_tiny: Callable[..., Path], tmp_path: Path
) -> None:
    slow = spinkv.load(
        make_tiny(
            hidden_size=256,
            intermediate_size=768,
            num_hidden_layers=6,
            num_attention_heads=8,
            num_key_value_heads=4,
            head_dim=32,
            max_position_embeddings=1024,
        )
    )
    kv = {**TURBO_SMALL, "max_context": 256}
    base = slow.chat(kv=kv, max_tokens=60)
    base.ask("The quick brown fox jumps over the lazy dog. " * 4)
    base.save(tmp_path / "base.spkv")
    turn = "Tokens are the pieces that a tokenizer cuts text into. " * 3

    def fresh() -> ChatSession:
        chat = slow.chat(kv=kv, max_tokens=60)
        assert chat.restore(tmp_path / "base.spkv").reused
        return chat

    reference = fresh()
    before = digest(reference)
    started = time.perf_counter()
    reference.ask(turn)
    duration = time.perf_counter() - started
    complete = digest(reference)

    rng = random.Random(5)
    outcomes = {"rolled back": 0, "completed": 0}
    for _ in range(16):
        chat = fresh()
        timer = threading.Timer(rng.uniform(0, duration * 1.1), _thread.interrupt_main)
        try:
            try:
                timer.start()
                for _piece in chat.send(turn):
                    pass
            finally:
                timer.cancel()
                timer.join()
        except KeyboardInterrupt:
            chat.cancel()
        state = digest(chat)
        assert state in (before, complete)
        outcomes["rolled back" if state == before else "completed"] += 1
    print(f"turn {duration * 1000:.0f} ms: {outcomes}")
    assert outcomes["rolled back"] >= 5, outcomes


# ---- lifecycle ------------------------------------------------------------------------------


def test_sliding_window_chat_outlives_its_context_and_restores(
    tiny: LoadedModel, tmp_path: Path
) -> None:
    kv = {**TURBO_SMALL, "max_context": 64}
    chat = tiny.chat(kv=kv, max_tokens=10)
    assert chat.slide
    for i in range(8):
        chat.ask(f"message {i}: the quick brown fox")
    stats = chat.stats()
    assert stats["retired_tokens"] > 0 and stats["cached_tokens"] <= 64
    assert len(chat.session) == stats["retired_tokens"] + stats["cached_tokens"]
    chat.save(tmp_path / "slid.spkv")
    again = tiny.chat(kv=kv, max_tokens=10)
    assert again.restore(tmp_path / "slid.spkv").reused
    assert digest(again) == digest(chat)
    assert again.ask("one more").text == chat.ask("one more").text
    # A message longer than the whole context is still refused, the chat untouched.
    state = digest(chat)
    with pytest.raises(InvalidInputError, match="context"):
        chat.send("word " * 100)
    assert digest(chat) == state


def test_a_sliding_turn_counts_as_cached_only_what_it_read_from_the_cache(
    tiny: LoadedModel,
) -> None:
    from spinkv.cli.render import timing_line

    chat = tiny.chat(kv={**TURBO_SMALL, "max_context": 64}, max_tokens=10)
    for i in range(8):
        chat.ask(f"message {i}: the quick brown fox")
    retired, in_cache = int(chat.session.retired), chat.cached_tokens
    assert retired > 0, "the cache has slid"
    result = chat.ask("one more")
    assert 0 < result.cached_tokens <= in_cache <= 64
    # Slid-out tokens are part of the prompt, but neither read from the cache nor computed.
    assert retired + result.cached_tokens + result.timings.prefill_tokens == result.prompt_tokens
    assert f"+{result.cached_tokens} cached" in timing_line(result)


LONG_KV = {**TURBO_SMALL, "max_context": 256}
"""A context the long conversation below is several times as long as."""
OTHER_KV = {**LONG_KV, "window": 32}
"""The same context, another recent window: a cache saved under LONG_KV is refused."""


def long_chat(model: LoadedModel, turns: int = 12) -> ChatSession:
    chat = model.chat(kv=LONG_KV, max_tokens=10)
    for i in range(turns):
        chat.ask(f"message {i}: the quick brown fox jumps")
    return chat


def rendered_tokens(model: LoadedModel, chat: ChatSession) -> int:
    return len(model.tokenize(model.render_chat(chat.messages)))


@pytest.fixture(scope="module")
def long_session(tiny: LoadedModel, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A sliding chat saved under LONG_KV whose transcript is over 3 contexts long."""
    chat = long_chat(tiny)
    assert chat.stats()["retired_tokens"] > 0
    assert rendered_tokens(tiny, chat) > 3 * 256
    path = tmp_path_factory.mktemp("long") / "long.spkv"
    chat.save(path)
    return path


def test_a_refused_long_transcript_re_reads_only_the_newest_turns(
    tiny: LoadedModel, long_session: Path, tmp_path: Path
) -> None:
    from spinkv.sessions.store import read_transcript

    chat = tiny.chat(kv=OTHER_KV, max_tokens=10)
    outcome = chat.restore(long_session)
    assert not outcome.reused and outcome.fields == ["recent_window"]
    assert outcome.messages == 24 and 0 < outcome.context_start < 24
    assert chat.history[outcome.context_start]["role"] == "user", "whole turns"
    assert len(chat.history) == 24 and chat.context_start == outcome.context_start

    first = chat.ask("and now?")
    assert first.cached_tokens == 0
    # The turns re-read fit the context with room for the reply (planned without the new
    # message, which may take some of that room), so the prefill is one context at most.
    assert first.timings.prefill_tokens == first.prompt_tokens <= 256, "one context at most"
    assert first.prompt_tokens > 256 // 2, "as many turns as fit"
    assert chat.cached_tokens <= 256
    # Tokens that slid out before a turn are neither read from the cache nor computed again.
    retired = int(chat.session.retired)
    second = chat.ask("and then?")
    assert retired + second.cached_tokens >= first.prompt_tokens, "the cache is reused"
    new_tokens = second.prompt_tokens - retired - second.cached_tokens
    assert second.timings.prefill_tokens == new_tokens < 64

    chat.save(tmp_path / "again.spkv")
    transcript, _ = read_transcript(tmp_path / "again.spkv")
    assert len(transcript.messages) == 28 and transcript.messages == chat.history
    assert transcript.context_start == outcome.context_start
    resumed = tiny.chat(kv=OTHER_KV, max_tokens=10)
    again = resumed.restore(tmp_path / "again.spkv")
    assert again.reused and again.context_start == outcome.context_start
    retired = int(resumed.session.retired)
    third = resumed.ask("and at last?")
    assert retired + third.cached_tokens >= second.prompt_tokens, "goes on from the same message"
    assert third.timings.prefill_tokens < 64


def test_a_refused_short_transcript_is_re_prefilled_whole(
    tiny: LoadedModel, tmp_path: Path
) -> None:
    chat = long_chat(tiny, turns=2)
    chat.save(tmp_path / "short.spkv")
    other = tiny.chat(kv=OTHER_KV, max_tokens=10)
    outcome = other.restore(tmp_path / "short.spkv")
    assert not outcome.reused and outcome.context_start == 0
    whole = len(
        tiny.tokenize(tiny.render_chat(other.messages + [{"role": "user", "content": "hi"}]))
    )
    result = other.ask("hi")
    assert result.cached_tokens == 0 and result.timings.prefill_tokens == result.prompt_tokens
    assert result.prompt_tokens == whole and other.context_start == 0


def test_a_chat_that_does_not_slide_still_refuses_a_long_transcript(
    tiny: LoadedModel, long_session: Path
) -> None:
    chat = ChatSession(tiny, kv=OTHER_KV, max_tokens=10, slide=False)
    outcome = chat.restore(long_session)
    assert not outcome.reused and outcome.context_start == 0
    with pytest.raises(InvalidInputError, match="context"):
        chat.send("and now?")
    assert len(chat.history) == 24 and len(chat.session) == 0


def test_long_conversations_fed_from_nothing_keep_to_one_context(
    tiny: LoadedModel, long_session: Path
) -> None:
    source = tiny.chat(kv=OTHER_KV)
    source.restore(long_session)
    fresh = tiny.chat(kv=OTHER_KV, max_tokens=10)
    fresh._history = source.history  # a new chat given a long history
    result = fresh.ask("and now?")
    assert result.timings.prefill_tokens == result.prompt_tokens <= 256 - 10
    assert fresh.context_start > 0 and len(fresh.history) == 26
    # A new system prompt in a chat whose start slid out: rebuilt from the newest turns too.
    slid = long_chat(tiny, turns=8)
    slid.set_system("Answer briefly.")
    result = slid.ask("and now?")
    assert result.timings.prefill_tokens <= 256 - 10 and slid.context_start > 0
    retired = int(slid.session.retired)
    assert retired + slid.ask("more?").cached_tokens >= result.prompt_tokens


def test_a_new_system_prompt_before_the_cache_slid_keeps_to_one_context(
    tiny: LoadedModel,
) -> None:
    """A changed system prompt shares only the template's first tokens with the cache: the
    turn is a rebuild, fed from the newest turns that fit, not a prefill past the context."""
    chat = long_chat(tiny, turns=3)
    assert chat.stats()["retired_tokens"] == 0
    chat.set_system("You answer briefly, carefully and politely. " * 6)
    everything = tiny.tokenize(
        tiny.render_chat(chat.messages + [{"role": "user", "content": "and now?"}])
    )
    assert len(everything) > 256 - 10, "without the rebuild the prefill would not fit"
    result = chat.ask("and now?")
    assert result.timings.prefill_tokens <= 256 - 10 and chat.context_start > 0


def test_chat_says_how_much_of_a_long_refused_session_it_re_reads(
    tiny: LoadedModel, long_session: Path, spinkv_home: Path
) -> None:
    path = session_path("long")
    path.parent.mkdir(parents=True)
    shutil.copy(long_session, path)
    done = spinkv_cli("chat", "-n", "4", "--kv-window", "32", "--session", "long", stdin="hi\n")
    assert done.returncode == 0, done.stderr
    assert "KV cache not reused" in done.stderr and "recent_window" in done.stderr
    assert "re-reads the last" in done.stderr and "of 24 messages" in done.stderr
    prefill = [line for line in done.stderr.splitlines() if "prefill" in line][0]
    assert int(prefill.split("prefill ")[1].split(" tok")[0]) <= 256, prefill
    exported = json.loads(spinkv_cli("sessions", "export", "long", "--format", "json").stdout)
    assert len(exported["messages"]) == 26, "the session keeps every message"


ROOMY_KV = {**LONG_KV, "max_context": 512}
"""The tiny model's whole context: a session saved under it resumes under LONG_KV refused (another
context) and has to fit LONG_KV's 256 tokens."""
LONG_SYSTEM = "You answer every question in full sentences. " * 7
"""About 270 tokens as the tiny model's template renders it: over LONG_KV's prompt budget."""


def saved_chat(model: LoadedModel, path: Path, system: str | None, message: str) -> Path:
    """A one-turn chat saved at path under ROOMY_KV (greedy: the same file every run)."""
    chat = model.chat(system, kv=ROOMY_KV, max_tokens=4)
    chat.ask(message)
    chat.save(path)
    return path


def test_a_resume_names_the_system_prompt_when_it_alone_leaves_no_room(
    tiny: LoadedModel, tmp_path: Path
) -> None:
    from spinkv.chat.command import restore_note

    path = saved_chat(tiny, tmp_path / "system.spkv", LONG_SYSTEM, "hi")
    chat = tiny.chat(kv=LONG_KV, max_tokens=10)
    outcome = chat.restore(path)
    assert not outcome.reused and chat.system == LONG_SYSTEM
    assert outcome.context_start == outcome.messages == 2, "no message fits"
    assert outcome.prompt_budget == 256 - 10 < outcome.system_tokens < 256 + 32
    assert outcome.system_overflows
    note = restore_note("s", outcome)
    assert "system prompt alone is" in note and "newest turn" not in note, note
    assert "--max-context" in note and "--system" in note, note
    # A system prompt given on resume is the one the messages are chosen beside.
    brief = tiny.chat(kv=LONG_KV, max_tokens=10)
    outcome = brief.restore(path, system="Be brief.")
    assert brief.system == "Be brief." and not outcome.system_overflows
    assert outcome.context_start == 0, "the whole conversation fits beside it"


def test_a_resume_still_blames_a_newest_turn_too_long_for_the_context(
    tiny: LoadedModel, tmp_path: Path
) -> None:
    from spinkv.chat.command import restore_note

    path = saved_chat(tiny, tmp_path / "turn.spkv", "Be brief.", "a long question " * 20)
    outcome = tiny.chat(kv=LONG_KV, max_tokens=10).restore(path)
    assert not outcome.reused and outcome.context_start == outcome.messages == 2
    assert 0 < outcome.system_tokens < outcome.prompt_budget and not outcome.system_overflows
    note = restore_note("s", outcome)
    assert "newest turn alone does not fit" in note and "system prompt" not in note, note


def test_chat_resumed_with_a_context_too_small_for_its_system_prompt(
    tiny: LoadedModel, tmp_path: Path, spinkv_home: Path
) -> None:
    path = session_path("sys")
    path.parent.mkdir(parents=True)
    saved_chat(tiny, path, LONG_SYSTEM, "hi")
    greedy = ("-n", "4", "--temperature", "0", "--max-context", "256")
    done = spinkv_cli("chat", *greedy, "--session", "sys", stdin="hello\n")
    assert done.returncode == 0, done.stderr
    assert "its system prompt alone is" in done.stderr, done.stderr
    assert "raise --max-context or change the system prompt" in done.stderr, done.stderr
    assert "newest turn" not in done.stderr and "Traceback" not in done.stderr, done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "system prompt" in errors[0], done.stderr
    # Following the note's advice: a shorter system prompt, and the chat answers.
    done = spinkv_cli("chat", *greedy, "--session", "sys", "--system", "Be brief.", stdin="hi\n")
    assert done.returncode == 0, done.stderr
    assert "system prompt alone" not in done.stderr and "error:" not in done.stderr, done.stderr
    assert "re-prefilled on the next turn" in done.stderr, done.stderr
    assert "prefill" in done.stderr, "a turn was answered"


def test_clear_is_a_deterministic_reset(tiny: LoadedModel) -> None:
    new = tiny.chat(kv=TURBO_SMALL)
    chat = chat_with_history(tiny)
    chat.ask("a much longer message to grow the cache " * 3)
    assert chat.stats()["cache"]["pool_bytes"] > new.stats()["cache"]["pool_bytes"]
    chat.clear()
    assert digest(chat) == digest(new)
    assert chat.stats()["cache"]["pool_bytes"] == new.stats()["cache"]["pool_bytes"]
    first, again = tiny.chat(kv=TURBO_SMALL, max_tokens=12).ask("hi"), chat.ask("hi")
    assert first.text == again.text


def test_model_hash_is_content_based_and_cached(
    native: ModuleType, make_tiny: Callable[..., Path], tmp_path: Path
) -> None:
    copy = Path(shutil.copytree(make_tiny(), tmp_path / "copy"))
    (copy / ".spinkv-model-hash").unlink(missing_ok=True)
    a = native.Model.load(str(copy)).content_hash()
    assert (copy / ".spinkv-model-hash").is_file()
    assert native.Model.load(str(make_tiny())).content_hash() == a, "content, not path"
    assert native.Model.load(str(copy)).content_hash() == a
    weights = copy / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1
    weights.write_bytes(bytes(data))
    assert native.Model.load(str(copy)).content_hash() != a


def test_transcripts_round_trip_and_reject_foreign_json() -> None:
    t = Transcript(messages=[{"role": "user", "content": "hi"}], system="be brief")
    back = Transcript.from_json(t.to_json())
    assert (back.messages, back.system, back.turns) == (t.messages, "be brief", 1)
    for text in (
        "not json",
        "[]",
        '{"format": "other"}',
        '{"format": "spinkv-transcript", "version": 1, "messages": [1]}',
    ):
        with pytest.raises(spinkv.SpinkvError):
            Transcript.from_json(text)


def test_transcripts_keep_context_start_and_ignore_a_bad_one() -> None:
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    plain = Transcript(messages=messages)
    assert "context_start" not in json.loads(plain.to_json()), "files as before"
    assert Transcript.from_json(Transcript(messages, context_start=2).to_json()).context_start == 2
    for bad in (-1, 3, "1", True, None):
        record = {**json.loads(plain.to_json()), "context_start": bad}
        assert Transcript.from_json(json.dumps(record)).context_start == 0


def test_the_fed_window_starts_at_a_user_turn_that_fits() -> None:
    from spinkv.context_window import first_fitting, prompt_budget, reply_room, turn_starts

    history = [{"role": r} for r in ("user", "assistant") * 3]
    assert turn_starts(history, 0) == [0, 2, 4, 6]
    assert turn_starts(history, 3) == [3, 4, 6] and turn_starts(history, 6) == [6]
    sizes = {0: 300, 2: 200, 4: 100, 6: 10}
    assert first_fitting([0, 2, 4, 6], lambda i: sizes[i] <= 250) == 2
    assert first_fitting([0, 2, 4, 6], lambda i: sizes[i] <= 5) == 6, "the end when none fits"
    assert first_fitting([0, 2, 4, 6], lambda i: True) == 0
    assert reply_room(512, 1024) == 128 and reply_room(512, 40) == 40
    assert reply_room(512, "many") == 128 and prompt_budget(512, 40) == 472
