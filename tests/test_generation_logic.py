"""Pure-Python pieces of generation: sampling validation, cache prefix reuse, streaming text,
chat input parsing. No model and no runtime involved."""

from __future__ import annotations

import math

import pytest
from spinkv.commands.chat import parse_command, read_message
from spinkv.commands.failures import describe
from spinkv.errors import InvalidInputError
from spinkv.generation import (
    chunked,
    common_prefix_length,
    reusable_prefix,
)
from spinkv.sampling import SamplingParams
from spinkv.timing import GenerationTimings

# ---- sampling ----------------------------------------------------------------------------


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


# ---- cache prefix reuse ------------------------------------------------------------------


def test_common_prefix_length() -> None:
    assert common_prefix_length([], [1, 2]) == 0
    assert common_prefix_length([1, 2, 3], [1, 2, 3]) == 3
    assert common_prefix_length([1, 2, 3], [1, 2, 4, 5]) == 2
    assert common_prefix_length([1, 2, 3, 4], [1, 2]) == 2


def test_reuse_keeps_cached_prefix_of_the_new_prompt() -> None:
    cached = [1, 2, 3, 4]  # previous prompt and reply
    prompt = [1, 2, 3, 4, 5, 6]  # the same, then the new turn
    assert reusable_prefix(cached, prompt) == 4


def test_reuse_cuts_back_to_where_the_rendering_differs() -> None:
    # The reply's text re-tokenizes differently from the sampled tokens (7 vs 8 9).
    assert reusable_prefix([1, 2, 7], [1, 2, 8, 9, 5]) == 2
    # A new system prompt changes the first token: nothing is reused.
    assert reusable_prefix([1, 2, 3], [9, 2, 3, 4]) == 0


def test_reuse_always_recomputes_the_last_prompt_token() -> None:
    assert reusable_prefix([1, 2, 3], [1, 2, 3]) == 2
    assert reusable_prefix([1, 2, 3, 4], [1, 2, 3]) == 2
    assert reusable_prefix([], [1]) == 0


def test_chunks_cover_the_tokens_in_order() -> None:
    tokens = list(range(10))
    chunks = list(chunked(tokens, 4))
    assert chunks == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    assert list(chunked([], 4)) == []


# ---- timings -----------------------------------------------------------------------------


def test_timings_rates_and_record() -> None:
    timings = GenerationTimings(prefill_tokens=100, prefill_ms=200.0, decode_tokens=0)
    assert timings.prefill_tok_per_s == pytest.approx(500.0)
    assert timings.decode_tok_per_s is None
    timings.add_native_breakdown({"attention_ms": 1, "matmul_ms": 2.5, "other_ms": None})
    record = timings.to_dict()
    assert record["attention_ms"] == 1.0 and record["matmul_ms"] == 2.5
    assert record["other_ms"] is None
    assert record["prefill_tok_per_s"] == pytest.approx(500.0)


# ---- chat input --------------------------------------------------------------------------


def _lines(*lines: str):  # type: ignore[no-untyped-def]
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


def test_read_message_block_on_one_line_and_bare_opening() -> None:
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


def test_describe_os_error_in_one_line() -> None:
    error = FileNotFoundError(2, "No such file or directory", "/nope/config.json")
    assert describe(error) == "No such file or directory: /nope/config.json"
    assert describe(InvalidInputError("bad\nthing")) == "bad thing"
