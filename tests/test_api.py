"""The public Python API.

The first part tests pure logic (sampling validation, cache prefix reuse, timings) without a
model. Everything after "end to end" runs the real native runtime on the tiny random model
(and on SmolLM2 where stated): no part of the runtime is replaced.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest
import spinkv
from helpers import run_on_threads
from spinkv.api import ChatSession, LoadedModel
from spinkv.errors import InvalidInputError
from spinkv.generation import chunked, common_prefix_length
from spinkv.kv.options import kv_dict, kv_options
from spinkv.sampling import SamplingParams
from spinkv.timing import GenerationTimings

# ---- sampling validation -----------------------------------------------------------------


def test_default_sampling_is_greedy() -> None:
    assert SamplingParams().is_greedy


@pytest.mark.parametrize(
    ("field", "value", "fragment"),
    [
        ("temperature", -1.0, "temperature"),
        ("temperature", math.nan, "finite"),
        ("temperature", math.inf, "finite"),
        ("top_k", -3, "top_k"),
        ("top_k", 2.5, "integer"),
        ("top_p", 0.0, "top_p"),
        ("top_p", 1.5, "top_p"),
        ("min_p", -0.1, "min_p"),
        ("min_p", 1.0, "min_p"),
        ("repetition_penalty", 0.0, "repetition_penalty"),
        ("repeat_last_n", -1, "repeat_last_n"),
        ("seed", -5, "seed"),
        ("seed", 2**64, "seed"),
        ("temperature", "hot", "number"),
        ("top_k", True, "integer"),
    ],
)
def test_invalid_sampling_values_name_the_value_in_one_line(
    field: str, value: object, fragment: str
) -> None:
    with pytest.raises(InvalidInputError) as caught:
        SamplingParams(**{field: value})  # type: ignore[arg-type]
    message = str(caught.value)
    assert fragment in message
    assert "\n" not in message


def test_valid_sampling_values_are_accepted() -> None:
    params = SamplingParams(
        temperature=0.7, top_k=40, top_p=0.9, min_p=0.05, repetition_penalty=1.1, seed=0
    )
    assert not params.is_greedy
    assert params.to_dict()["top_k"] == 40


# ---- cache prefix reuse (pure) -----------------------------------------------------------


def test_common_prefix_length() -> None:
    assert common_prefix_length([], [1, 2]) == 0
    assert common_prefix_length([1, 2, 3], [1, 2, 3]) == 3
    assert common_prefix_length([1, 2, 3], [1, 2, 4, 5]) == 2
    assert common_prefix_length([1, 2, 3, 4], [1, 2]) == 2


def reused(model: LoadedModel, cached: list[int], prompt: list[int]) -> int:
    """How many of `cached` a session keeps for `prompt` (the runtime's rule)."""
    session = model.session("fp16")
    if cached:
        session.prefill(cached)
    return int(session.reuse_prefix(prompt))


def test_reuse_keeps_the_cached_prefix_of_the_new_prompt(tiny: LoadedModel) -> None:
    cached = [1, 2, 3, 4]  # previous prompt and reply
    prompt = [1, 2, 3, 4, 5, 6]  # the same, then the new turn
    assert reused(tiny, cached, prompt) == 4


def test_reuse_cuts_back_to_where_the_rendering_differs(tiny: LoadedModel) -> None:
    # The reply's text re-tokenizes differently from the sampled tokens (7 vs 8 9).
    assert reused(tiny, [1, 2, 7], [1, 2, 8, 9, 5]) == 2
    # A new system prompt changes an early token: only what precedes it is reused.
    assert reused(tiny, [1, 2, 3], [9, 2, 3, 4]) == 0


def test_reuse_always_recomputes_the_last_prompt_token(tiny: LoadedModel) -> None:
    assert reused(tiny, [1, 2, 3], [1, 2, 3]) == 2
    assert reused(tiny, [1, 2, 3, 4], [1, 2, 3]) == 2
    assert reused(tiny, [], [1]) == 0


def test_chunks_cover_the_tokens_in_order() -> None:
    assert list(chunked(list(range(10)), 4)) == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    assert list(chunked([], 4)) == []


def test_kv_options_keep_only_what_is_set() -> None:
    assert kv_options() is None
    assert kv_options("turbo", k_bits=3.5, window=0) == {
        "preset": "turbo",
        "k_bits": 3.5,
        "window": 0,
    }
    assert kv_options("turbo", sparse_v=0.0) == {"preset": "turbo", "sparse_v": 0.0}
    assert kv_dict("fp16") == {"preset": "fp16"}
    assert kv_dict({}) is None
    with pytest.raises(InvalidInputError):
        kv_dict(3)  # type: ignore[arg-type]


def test_timings_rates_and_record() -> None:
    timings = GenerationTimings(prefill_tokens=100, prefill_ms=200.0, decode_tokens=0)
    assert timings.prefill_tok_per_s == pytest.approx(500.0)
    assert timings.decode_tok_per_s is None
    timings.add_native_breakdown({"attention_ms": 1, "matmul_ms": 2.5, "other_ms": None})
    record = timings.to_dict()
    assert record["attention_ms"] == 1.0 and record["matmul_ms"] == 2.5
    assert record["other_ms"] is None
    assert record["prefill_tok_per_s"] == pytest.approx(500.0)


# ---- end to end (real runtime) -----------------------------------------------------------


@pytest.fixture(scope="module")
def tiny(native: ModuleType, tiny_model_dir: Path) -> LoadedModel:
    return spinkv.load(tiny_model_dir)


@pytest.fixture(scope="module")
def short_context(native: ModuleType, make_tiny: Callable[..., Path]) -> LoadedModel:
    return spinkv.load(make_tiny(max_position_embeddings=48))


def test_load_reports_the_model(tiny: LoadedModel, tiny_model_dir: Path) -> None:
    info = tiny.info
    assert info["name"] == tiny_model_dir.name
    assert info["vocab_size"] == tiny.vocab_size > 0
    assert info["max_context"] == tiny.max_context > 0
    assert info["eos_token_ids"], "the tiny model declares an end-of-turn token"
    assert info["isa"] and info["threads"] >= 1
    assert tiny.load_ms > 0


def test_tokenize_roundtrip(tiny: LoadedModel) -> None:
    text = "the quick brown fox"
    assert tiny.detokenize(tiny.tokenize(text)) == text


def test_generate_is_deterministic_and_reports_everything(tiny: LoadedModel) -> None:
    first = tiny.generate("hello there", max_tokens=12)
    second = tiny.generate("hello there", max_tokens=12)
    assert first.token_ids == second.token_ids and first.text == second.text
    assert first.finish_reason in ("stop", "length")
    assert 0 < first.completion_tokens <= 12 or first.finish_reason == "stop"
    assert first.prompt_tokens == len(tiny.prompt_token_ids("hello there"))
    t = first.timings
    assert t.prefill_tokens == first.prompt_tokens and t.prefill_ms > 0
    assert t.first_token_ms is not None and t.first_token_ms >= t.prefill_ms
    assert t.decode_tokens == max(first.completion_tokens - 1, 0)
    assert t.isa == spinkv._native.isa() and t.threads == spinkv._native.threads()
    assert t.attention_ms is not None and t.matmul_ms is not None
    record = first.to_dict()
    assert set(record) >= {"text", "prompt_tokens", "completion_tokens", "finish_reason"}


def test_stream_pieces_make_the_result(tiny: LoadedModel) -> None:
    stream = tiny.stream("tell me about the tiny model", max_tokens=16)
    pieces = list(stream)
    assert "".join(pieces) == stream.result.text
    assert stream.result.text == tiny.generate("tell me about the tiny model", max_tokens=16).text


def test_max_tokens_stops_with_length(tiny: LoadedModel) -> None:
    ids = tiny.prompt_token_ids("hello")
    first = int(np.argmax(tiny.logits(ids)[-1]))
    assert first not in tiny.tokenizer.eos_token_ids, "the prompt's first reply token is not EOS"
    result = tiny.generate("hello", max_tokens=1)
    assert result.finish_reason == "length" and result.token_ids == [first]


def test_sampling_with_a_seed_is_reproducible(tiny: LoadedModel) -> None:
    params = SamplingParams(temperature=1.0, top_k=50, top_p=0.95, seed=7)
    a = tiny.generate("hello", max_tokens=10, sampling=params)
    b = tiny.generate("hello", max_tokens=10, sampling=params)
    assert a.token_ids == b.token_ids


def test_raw_prompt_skips_the_chat_template(tiny: LoadedModel) -> None:
    raw = tiny.generate("hello", raw=True, max_tokens=4)
    assert raw.prompt_tokens == len(tiny.tokenize("hello", add_special_tokens=True))


def test_system_and_messages_render_the_same_prompt(tiny: LoadedModel) -> None:
    by_argument = tiny.prompt_token_ids("hi", system="Be brief.")
    by_messages = tiny.prompt_token_ids(
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]
    )
    assert by_argument == by_messages
    with pytest.raises(InvalidInputError):
        tiny.prompt_token_ids([{"role": "system", "content": "x"}], system="y")


def test_logits_shape_and_causality(tiny: LoadedModel) -> None:
    ids = tiny.tokenize("the quick brown fox jumps over the lazy dog")
    logits = tiny.logits(ids)
    assert logits.shape == (len(ids), tiny.vocab_size) and logits.dtype == np.float32
    head = tiny.logits(ids[:4])
    np.testing.assert_allclose(head, logits[:4], atol=1e-4)


def test_logits_in_pieces_equal_one_pass(tiny: LoadedModel) -> None:
    ids = tiny.tokenize("a b c d e f g h i j k l m n o p q r s t u v w x y z " * 2)
    whole = tiny.logits(ids)
    session = tiny.session()
    pieces = [session.prefill(ids[lo : lo + 5], True) for lo in range(0, len(ids), 5)]
    np.testing.assert_allclose(np.concatenate(pieces, axis=0), whole, atol=1e-4)


def test_logits_refuse_bad_token_ids(tiny: LoadedModel) -> None:
    with pytest.raises(InvalidInputError, match="outside the vocabulary"):
        tiny.logits([0, tiny.vocab_size])
    with pytest.raises(InvalidInputError):
        tiny.logits([])


def test_prompt_longer_than_the_context(short_context: LoadedModel) -> None:
    with pytest.raises(InvalidInputError, match="context"):
        short_context.generate("word " * 200)


def test_reply_stops_when_the_context_is_full(
    short_context: LoadedModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(short_context.tokenizer, "eos_token_ids", frozenset())  # never stops
    prompt_tokens = len(short_context.prompt_token_ids("hi"))
    result = short_context.generate("hi", max_tokens=1000)
    assert result.finish_reason == "context"
    # The last sampled token is never decoded, so the cache ends one short of it.
    assert prompt_tokens + result.completion_tokens == short_context.max_context + 1


def test_kv_preset_passes_through(tiny: LoadedModel, monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[Any] = []
    make_session = tiny.session

    def spy(kv: Any = None) -> Any:
        session = make_session(kv)
        made.append(session)
        return session

    monkeypatch.setattr(tiny, "session", spy)
    tiny.generate("hello there, tiny model", kv={"preset": "turbo", "window": 0}, max_tokens=8)
    tiny.generate("hello there, tiny model", kv="fp16", max_tokens=8)
    turbo, fp16 = (session.cache_stats() for session in made)
    assert "turbo" in turbo["codec"] and turbo["total"]["compressed_tokens"] > 0
    assert "fp16" in fp16["codec"] and fp16["total"]["compressed_tokens"] == 0
    with pytest.raises(spinkv.SpinkvError, match="no-such-preset"):
        tiny.generate("hello", kv="no-such-preset", max_tokens=2)


# ---- chat sessions -----------------------------------------------------------------------


def _reply_from_scratch(model: LoadedModel, chat: ChatSession, text: str, max_tokens: int) -> str:
    """The reply a fresh session gives to the chat's conversation plus text."""
    messages = [*chat.messages, {"role": "user", "content": text}]
    return model.generate(messages, max_tokens=max_tokens).text


def test_chat_reuses_the_cache_and_matches_a_fresh_prefill(tiny: LoadedModel) -> None:
    chat = tiny.chat(max_tokens=10)
    first = chat.ask("hello")
    assert first.cached_tokens == 0
    expected = _reply_from_scratch(tiny, chat, "how are you", 10)
    second = chat.ask("how are you")
    assert second.text == expected, "cached multi-turn decoding equals a fresh prefill"
    assert second.cached_tokens > first.prompt_tokens // 2
    assert second.timings.prefill_tokens == second.prompt_tokens - second.cached_tokens
    assert [m["role"] for m in chat.history] == ["user", "assistant"] * 2
    assert chat.history[-1]["content"] == second.text


def test_chat_cache_tokens_are_the_conversation(tiny: LoadedModel) -> None:
    chat = tiny.chat(max_tokens=6)
    chat.ask("one")
    chat.ask("two")
    rendered = tiny.tokenize(tiny.render_chat(chat.messages, add_generation_prompt=False))
    cached = chat.session.tokens
    # Everything cached agrees with the conversation, except possibly the tail of the last
    # reply (sampled tokens that re-tokenize differently; fixed on the next turn).
    agree = common_prefix_length(cached, rendered)
    assert agree >= len(cached) - chat.last_result.completion_tokens  # type: ignore[union-attr]


def test_interrupted_reply_keeps_what_was_streamed(tiny: LoadedModel) -> None:
    chat = tiny.chat(max_tokens=30)
    stream = chat.send("tell me a long story")
    shown = ""
    for piece in stream:
        shown += piece
        if len(shown) >= 3:
            break
    stream.close()
    assert stream.result.finish_reason == "interrupted"
    assert chat.history[-1] == {"role": "assistant", "content": shown}
    # The conversation stays usable and consistent with its history.
    expected = _reply_from_scratch(tiny, chat, "go on", 8)
    assert chat.ask("go on", max_tokens=8).text == expected


def test_reply_closed_before_any_text_drops_the_turn(tiny: LoadedModel) -> None:
    chat = tiny.chat(max_tokens=8)
    chat.send("never mind").close()
    assert chat.history == []
    assert chat.last_result is not None and chat.last_result.finish_reason == "interrupted"
    assert chat.ask("hello").text == tiny.generate("hello", max_tokens=8).text


def test_chat_clear_and_system(tiny: LoadedModel) -> None:
    chat = tiny.chat(max_tokens=6)
    chat.ask("hello")
    chat.clear()
    assert chat.history == [] and chat.cached_tokens == 0
    chat.ask("hello")
    chat.set_system("You are terse.")
    expected = _reply_from_scratch(tiny, chat, "again", 6)
    result = chat.ask("again")
    assert result.text == expected
    assert result.cached_tokens < result.prompt_tokens // 2  # the system prompt comes first


def test_chat_stats(tiny: LoadedModel) -> None:
    chat = tiny.chat(max_tokens=4)
    chat.ask("hello")
    stats = chat.stats()
    assert stats["turns"] == 1
    assert stats["cached_tokens"] == chat.cached_tokens > 0
    assert stats["cache"]["tokens"] == chat.cached_tokens


def test_chat_too_long_for_the_context_is_refused_untouched(short_context: LoadedModel) -> None:
    chat = short_context.chat(max_tokens=4)
    chat.ask("hi")
    before = chat.session.tokens
    with pytest.raises(InvalidInputError, match="context"):
        chat.send("word " * 200)
    assert chat.session.tokens == before
    assert len(chat.history) == 2


# ---- the default model -------------------------------------------------------------------


def test_smollm2_knows_the_capital_of_france(native: ModuleType, default_model_dir: Path) -> None:
    model = spinkv.load(default_model_dir)
    result = model.generate("What is the capital of France?", max_tokens=24)
    assert result.text.startswith("The capital of France is Paris.")
    chat = model.chat(max_tokens=24)
    assert chat.ask("What is the capital of France?").text.startswith(
        "The capital of France is Paris."
    )
    second = chat.ask("And of Germany?")
    assert second.cached_tokens > 0
    assert "Berlin" in second.text


def test_smollm2_q8_0_weights_answer_like_f16(native: ModuleType, default_model_dir: Path) -> None:
    """The default model with 8-bit weights (half the bytes) gives the same answer."""
    from spinkv.models.store import pull

    q8 = spinkv.load(pull("smollm2", dtype="q8_0"))
    assert q8.info["dtype"] == "q8_0"
    result = q8.generate("What is the capital of France?", max_tokens=24)
    assert result.text.startswith("The capital of France is Paris.")


def test_generations_on_several_threads_at_once_match_one_at_a_time(
    native: ModuleType, default_model_dir: Path
) -> None:
    """Forward passes from several Python threads share one thread team and take turns on it:
    each finishes (joins are bounded) with the tokens it gives alone. Prompts long enough that
    decode attention is split between the team's threads (past depth 57)."""
    model = spinkv.load(default_model_dir)
    prompts = [f"Write {n} sentences about the sea, the wind and the ships. " * 6 for n in (2, 3)]
    kvs = ["turbo", "fp16"]
    alone = [model.generate(p, max_tokens=16, kv=kv).token_ids for p, kv in zip(prompts, kvs)]
    together: dict[int, list[int]] = {}

    def run(i: int) -> None:
        together[i] = model.generate(prompts[i % 2], max_tokens=16, kv=kvs[i % 2]).token_ids

    run_on_threads(run, 4)
    assert all(together[i] == alone[i % 2] for i in range(4))
