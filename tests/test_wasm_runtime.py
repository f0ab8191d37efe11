"""The whole runtime built for wasm32+simd128 and run in node: greedy tokens identical to the
native runtime (fp16 and turbo KV), the same prompt tokens from the same chat template and
tokenizer, the same identity record, and session files exchanged both ways.

Skips with one line when node or a wasm toolchain is missing; SPINKV_REQUIRE_CROSS=1 (CI)
turns that into a failure."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

PROMPTS = [
    "What is the capital of France?",
    "Write a short story about a robot who learns to paint.",
]
MAX_TOKENS = 64


def _require(reason: str) -> None:
    if os.environ.get("SPINKV_REQUIRE_CROSS") == "1":
        pytest.fail(f"SPINKV_REQUIRE_CROSS=1 but {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="module")
def wasm_bundle() -> Path:
    """The wasm runtime, built (or brought up to date) for this run."""
    if os.environ.get("SPINKV_SKIP_CROSS") == "1":
        pytest.skip("SPINKV_SKIP_CROSS=1")
    from spinkv.web.bundle import BundleError, build_bundle, find_toolchain
    from spinkv.web.node import node_binary

    try:
        node_binary()
        find_toolchain()
    except BundleError as exc:
        _require(f"wasm runtime not testable here: {exc}")
    return build_bundle(print)


@pytest.fixture(scope="module")
def loaded(default_model_dir: Path) -> Any:
    import spinkv

    return spinkv.load(default_model_dir)


def _ok(record: dict[str, Any]) -> dict[str, Any]:
    assert record["ok"], record
    return record["result"]


def _run(wasm: Path, model_dir: Path, calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
    from spinkv.web.node import run_calls

    return run_calls(wasm, model_dir, calls)


def test_greedy_tokens_match_native(wasm_bundle: Path, loaded: Any) -> None:
    """fp16 and turbo: the same prompt ids and the same 64 greedy tokens as native."""
    calls: list[dict[str, Any]] = [{"op": "load"}, {"op": "info"}]
    expected = []
    for kv in ("fp16", "turbo"):
        for prompt in PROMPTS:
            native = loaded.generate(prompt, max_tokens=MAX_TOKENS, kv=kv)
            expected.append((kv, prompt, loaded.prompt_token_ids(prompt), native))
            calls.append({"op": "session", "kv": kv, "reserve": 512})
            calls.append(
                {
                    "op": "chat",
                    "messages": [{"role": "user", "content": prompt}],
                    "max_tokens": MAX_TOKENS,
                }
            )
    records = _run(wasm_bundle, loaded.path, calls)
    info = _ok(records[1])
    assert info["isa"] == "simd128" and info["threads"] == 1
    replies = [_ok(r) for r in records[3::2]]
    assert len(replies) == len(expected)
    for (kv, prompt, prompt_ids, native), wasm in zip(expected, replies):
        label = f"{kv}: {prompt!r}"
        assert wasm["prompt_ids"] == prompt_ids, label
        assert wasm["token_ids"] == native.token_ids, (label, wasm["text"], native.text)
        assert wasm["text"] == native.text, label
        assert "".join(wasm["pieces"]) == native.text, label
        assert wasm["reason"] == native.finish_reason, label
    # The long prompt really ran 64 tokens (not an early stop that proves little).
    assert any(len(r["token_ids"]) == MAX_TOKENS for r in replies)
    assert replies[0]["text"] == "The capital of France is Paris."


def test_identity_and_sessions_cross_between_native_and_wasm(
    wasm_bundle: Path, loaded: Any, tmp_path: Path
) -> None:
    """The identity record matches field by field (the build may differ); a native session
    file restores in wasm and a wasm one natively when the builds match, and is refused
    naming exactly runtime_build when they do not. A foreign preset is refused by name."""
    from spinkv import _native

    transcript = json.dumps({"format": "test"})
    prompt_ids = loaded.prompt_token_ids(PROMPTS[0])
    native = loaded.session("turbo")
    native.prefill(prompt_ids)
    native_file = tmp_path / "native.spkv"
    native.save(str(native_file), transcript, loaded.identity_extra)
    wasm_file = tmp_path / "wasm.spkv"
    records = _run(
        wasm_bundle,
        loaded.path,
        [
            {"op": "load"},
            {"op": "info"},
            {"op": "session", "kv": "turbo", "reserve": 256},
            {"op": "prefill", "tokens": prompt_ids},
            {"op": "identity"},
            {"op": "save_file", "path": str(wasm_file), "transcript": transcript},
            {"op": "session", "kv": "turbo", "reserve": 256},
            {"op": "restore_file", "path": str(native_file), "expect_error": True},
            {"op": "session", "kv": "fp16", "reserve": 256},
            {"op": "restore_file", "path": str(native_file), "expect_error": True},
        ],
    )
    wasm_build = _ok(records[1])["runtime_build"]
    identity = _ok(records[4])
    native_identity = native.identity(loaded.identity_extra)
    for name, value in identity["fields"].items():
        if name != "runtime_build":
            assert value == native_identity[name], name
    # SIMD128 has no FMA: its K/V bits differ from x86's in the last places (the greedy
    # tokens do not), so each side's pages are its own; a restore must reproduce them exactly.
    saved = _ok(records[5])
    assert saved["state_digest"] == identity["state_digest"]
    assert wasm_file.stat().st_size == saved["bytes"]

    same_build = wasm_build == _native.runtime_build()
    restored, foreign = records[7], records[9]
    back = loaded.session("turbo")
    if same_build:
        assert _ok(restored)["transcript"] == transcript
        assert _ok(restored)["state_digest"] == native.state_digest()
        assert back.load(str(wasm_file), loaded.identity_extra) == transcript
        assert back.state_digest() == identity["state_digest"]
    else:
        assert not restored["ok"] and restored["fields"] == ["runtime_build"], restored
        with pytest.raises(Exception, match="runtime_build") as info:
            back.load(str(wasm_file), loaded.identity_extra)
        assert list(info.value.fields) == ["runtime_build"]
    assert not foreign["ok"] and foreign["kind"] == "IdentityMismatchError"
    assert "bit_allocation" in foreign["fields"], foreign


def test_bad_calls_are_one_line_errors(wasm_bundle: Path, loaded: Any) -> None:
    records = _run(
        wasm_bundle,
        loaded.path,
        [
            {"op": "step", "expect_error": True},
            {"op": "load"},
            {"op": "session", "kv": "turbo:window=-1", "expect_error": True},
            {"op": "session", "kv": "nonsense", "expect_error": True},
            {"op": "session", "kv": "kivi2", "reserve": 64},
            {"op": "prefill", "tokens": [10**9], "expect_error": True},
            {"op": "turn", "prompt_ids": [1], "sampling": {"top_p": 2}, "expect_error": True},
            {"op": "no-such-op", "expect_error": True},
            {"op": "stats"},
        ],
    )
    failed = [r for r in records if not r["ok"]]
    assert len(failed) == 6, records
    for r in failed:
        assert r["error"] and "\n" not in r["error"], r
    assert "outside the vocabulary" in records[5]["error"]
    assert "top_p" in records[6]["error"]
    stats = _ok(records[8])
    assert stats["cache"]["codec"] == "kivi" and stats["memory"]["pages"] > 0


def test_a_chat_grows_no_memory_after_warm_up(wasm_bundle: Path, loaded: Any) -> None:
    """The short version of benches/web_memory.py: a turbo session (the whole context's pages
    reserved), a warm-up turn, `mark`, then turns whose prompts grow the conversation past a
    page boundary and a prefill block: no memory growth after warm-up, none during decode."""
    turn = {"op": "chat", "max_tokens": 8}
    calls: list[dict[str, Any]] = [
        {"op": "load"},
        {"op": "session", "kv": "turbo"},
        {**turn, "messages": [{"role": "user", "content": PROMPTS[0]}]},
        {"op": "mark"},
    ]
    paragraph = " ".join(["The quick brown fox jumps over the lazy dog."] * 30)
    for _ in range(2):
        calls.append({**turn, "append_ids": loaded.tokenize(f"<|im_end|>\n{paragraph}")})
    calls.append({"op": "stats"})
    records = _run(wasm_bundle, loaded.path, calls)
    stats = _ok(records[-1])
    memory = stats["memory"]
    assert stats["session"]["tokens"] > 600, stats["session"]
    assert memory["growth_events"] > 0  # the weights and the reserved pages
    assert memory["growth_since_mark"] == 0, memory
    assert memory["growth_during_decode"] == 0, memory
    assert memory["peak_pages"] == memory["pages"] > 0


def test_bench_isa_simd128_runs_the_model_in_wasm_beside_native(
    wasm_bundle: Path, default_model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`spinkv bench --isa simd128`: rows for the native ISA and for simd128 (the wasm runtime
    in node) from the same cases, the same greedy tokens, and the ratio in the notes."""
    from spinkv import _native
    from spinkv.cli.app import run_cli

    args = ["bench", "-m", str(default_model_dir), "--isa", "simd128", "-d", "32"]
    code = run_cli([*args, "-p", "0", "-n", "4", "-r", "1", "-t", "1", "--kv", "fp16", "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    record = json.loads(out)
    rows = {row["isa"]: row for row in record["rows"]}
    assert set(rows) == {_native.isa(), "simd128"}, rows.keys()
    wasm, native = rows["simd128"], rows[_native.isa()]
    assert wasm["tg_tok_s"] > 0 and wasm["depth"] == 32 and wasm["kv"] == "fp16"
    assert wasm["greedy_tokens"] == native["greedy_tokens"]
    assert wasm["peak_rss_bytes"] > 269_000_000  # the wasm memory holds the f16 weights
    assert any(n.startswith("decode simd128 (wasm, 1 thread) / ") for n in record["notes"])
    assert "simd128" in record["system"]["isas"]


def _conversation(turns: int) -> list[dict[str, str]]:
    """User/assistant turns of about 60 tokens each (the replies are not the model's)."""
    messages = []
    for i in range(turns):
        messages.append(
            {"role": "user", "content": f"Question {i}: " + "tell me about the sea " * 4}
        )
        messages.append({"role": "assistant", "content": f"Answer {i}: " + "the sea is wide " * 5})
    return messages


def test_a_sliding_chat_outlives_its_context(
    wasm_bundle: Path, loaded: Any, tmp_path: Path
) -> None:
    """As the terminal's chat, with a 256-token context: a conversation that outgrows it keeps
    being answered (the cache slides: tokens retire, no reply ends at "context"); a longer
    conversation fed to a fresh session renders from its newest whole turns, and the next turn
    goes on from the same message, reusing the cache; only a message that does not fit with
    the system prompt is refused, and a session that does not slide refuses as before. A saved
    chat transcript records the start, and a restored cache goes on from it."""
    kv = {"preset": "fp16", "max_context": 256, "page_tokens": 32}
    history = _conversation(8)
    turn = {"op": "chat", "max_tokens": 16}
    follow_up = history[:15] + [
        {"role": "assistant", "content": "Yes."},  # not the model's reply: the cache is cut
        {"role": "user", "content": "And the mountains?"},
    ]
    calls: list[dict[str, Any]] = [{"op": "load"}, {"op": "session", "kv": kv}]
    calls += [{**turn, "messages": history[: 2 * n + 1]} for n in range(8)]
    calls.append({"op": "stats"})
    long_start = len(calls)
    calls += [
        {"op": "session", "kv": kv},
        {**turn, "messages": history[:15]},
        {**turn, "messages": follow_up},
        {"op": "stats"},
        {**turn, "messages": [{"role": "user", "content": "sea " * 400}], "expect_error": True},
        {"op": "session", "kv": kv, "slide": False},
        {**turn, "messages": history[:15], "expect_error": True},
    ]
    saved_start = len(calls)
    chat_file = tmp_path / "long.spkv"
    calls += [
        {"op": "session", "kv": kv},
        {**turn, "messages": history[:15]},
        {
            "op": "save_file",
            "path": str(chat_file),
            "transcript": json.dumps({"format": "spinkv-transcript", "messages": []}),
        },
        {"op": "session", "kv": kv},
        {"op": "restore_file", "path": str(chat_file)},
        {**turn, "messages": follow_up},
    ]
    # A new system prompt in a chat that has not slid yet: what the prompt does not share with
    # the cache is over the prompt budget (256 - 16), so the cache is rebuilt from the newest
    # turns that fit instead of prefilling the whole rendering past the context.
    new_system_start = len(calls)
    system = {"role": "system", "content": "Answer briefly and kindly. " * 30}
    calls += [
        {"op": "session", "kv": kv},
        {**turn, "messages": history[:3]},
        {**turn, "messages": [system, *history[:5]]},
    ]
    records = _run(wasm_bundle, loaded.path, calls)
    assert _ok(records[1])["sliding"] is True
    replies = [_ok(r) for r in records[2:10]]
    assert all(r["reason"] in ("stop", "length") and r["completion_tokens"] > 0 for r in replies)
    assert all(r["context_start"] == 0 for r in replies), [r["context_start"] for r in replies]
    assert replies[-1]["prompt_tokens"] > 256  # the rendering is longer than the context
    # What slid out is part of the prompt but was not read from the cache.
    assert 0 < replies[-1]["cached_tokens"] <= 256, [r["cached_tokens"] for r in replies]
    session = _ok(records[10])["session"]
    assert session["retired_tokens"] > 0 and session["cache_len"] <= 256, session
    assert session["tokens"] == session["retired_tokens"] + session["cache_len"]

    fed, later, stats = (_ok(records[long_start + i]) for i in (1, 2, 3))
    # Room for the reply: max_tokens 16 of 256. The newest whole turns: a user message.
    assert fed["context_start"] > 0 and fed["context_start"] % 2 == 0, fed["context_start"]
    assert fed["prompt_tokens"] <= 256 - 16 and fed["cached_tokens"] == 0
    assert later["context_start"] == fed["context_start"]
    assert later["cached_tokens"] > 0
    assert stats["session"]["context_start"] == fed["context_start"]
    too_long = records[long_start + 4]
    assert too_long["kind"] == "ContextOverflowError", too_long
    assert "tokens but the context holds 256 tokens" in too_long["error"], too_long
    assert _ok(records[long_start + 5])["sliding"] is False
    refused = records[long_start + 6]
    assert refused["kind"] == "ContextOverflowError", refused

    # The transcript records the start; a restored cache goes on from it.
    saved = [_ok(records[saved_start + i]) for i in (1, 4, 5)]
    restored_start = json.loads(saved[1]["transcript"])["context_start"]
    assert restored_start == saved[0]["context_start"] == fed["context_start"]
    assert saved[2]["context_start"] == restored_start and saved[2]["cached_tokens"] > 0

    short, changed = (_ok(records[new_system_start + i]) for i in (1, 2))
    assert short["context_start"] == 0 and short["prompt_tokens"] < 240, short
    assert changed["context_start"] > 0 and changed["context_start"] % 2 == 0, changed
    assert changed["prompt_tokens"] <= 256 - 16, changed
