"""`spinkv bench` on the tiny model: output formats, case expansion, bad values, llama.cpp.

No assertion here is about speed: speed targets belong to benchmarks, not tests.
"""

from __future__ import annotations

import csv
import io
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from spinkv.bench import cases as bm
from spinkv.cli.app import run_cli
from spinkv.errors import InvalidInputError
from spinkv.eval.arms import KvArm

FAST = ["-p", "8", "-n", "4", "-r", "1"]


def bench(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = run_cli(["bench", *args])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def tiny(tiny_model_dir: Path, native: ModuleType) -> str:
    return str(tiny_model_dir)


# ---- output formats ---------------------------------------------------------------------------


def test_json_record(tiny: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = bench(
        capsys, "-m", tiny, *FAST, "-d", "0,16", "--kv", "fp16,turbo", "-f", "json"
    )
    assert code == 0
    record = json.loads(out)
    assert record["schema"] == "spinkv.bench/1"
    assert record["system"]["threads"] >= 1 and record["system"]["cpu"]
    assert record["system"]["isas"] == record["settings"]["isas"]
    rows = record["rows"]
    assert [(r["kv"], r["depth"]) for r in rows] == [
        ("fp16", 0),
        ("fp16", 16),
        ("turbo", 0),
        ("turbo", 16),
    ]
    for row in rows:
        assert row["engine"] == "spinkv" and row["reps"] == 1
        assert row["pp_tok_s"] > 0 and row["tg_tok_s"] > 0 and row["first_decode_ms"] > 0
        assert row["tg_tok_s_std"] == 0.0  # one repetition
        assert row["peak_rss_bytes"] > 0 and row["kv_payload_bytes"] > 0
        assert row["scratch_bytes"] is not None
        assert row["tg_matmul_ms"] >= 0 and row["pp_attention_ms"] >= 0
        assert (row["fill_tok_s"] is None) == (row["depth"] == 0)
    assert record["ratios"] == []
    memory = record["system"]["memory"]
    assert memory["read_gb_per_s"] > 0 and memory["probe_threads"] >= 1
    assert memory["decode_weight_bytes"] == decode_weight_bytes(Path(tiny))
    expected_bound = memory["read_gb_per_s"] * 1e9 / memory["decode_weight_bytes"]
    assert memory["weight_bound_tok_s"] == pytest.approx(expected_bound, rel=0.01)


def decode_weight_bytes(model_dir: Path) -> int:
    """Bytes of the projections and the LM head, from the safetensors headers alone."""
    total = 0
    for path in model_dir.glob("*.safetensors"):
        with path.open("rb") as f:
            header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
        for name, entry in header.items():
            if name.endswith("_proj.weight") or name == "lm_head.weight":
                start, end = entry["data_offsets"]
                total += end - start
    return total


def test_kv_phases_come_from_a_profiled_pass(tiny: str, capsys: pytest.CaptureFixture[str]) -> None:
    # window 0 and 8-token pages: the decode steps at depth 40 scan compressed pages and seal.
    args = ["-p", "0", "-n", "12", "-r", "1", "-d", "40", "-f", "json"]
    code, out, _ = bench(capsys, "-m", tiny, *args, "--kv", "fp16,turbo:window=0:page_tokens=8")
    assert code == 0
    fp16, turbo = json.loads(out)["rows"]
    for phase in ("query_transform", "key_scan", "softmax", "value_scan", "value_finish"):
        assert turbo[f"kv_{phase}_ms"] > 0, phase
    assert turbo["kv_append_encode_ms"] > 0 and turbo["kv_page_alloc_ms"] > 0
    # fp16 pages: scans and softmax are timed, nothing is ever encoded
    assert fp16["kv_key_scan_ms"] > 0 and fp16["kv_append_encode_ms"] == 0.0
    assert "kv_value_skipped_pct" not in fp16


def test_sparse_values_report_the_blocks_they_leave_out(
    tiny: str, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["-p", "0", "-n", "8", "-r", "1", "-d", "40", "-f", "json"]
    arms = "turbo:window=0:page_tokens=8:sparse_v=0,turbo:window=0:page_tokens=8:sparse_v=0.5"
    code, out, _ = bench(capsys, "-m", tiny, *args, "--kv", arms)
    assert code == 0
    every_page, sparse = json.loads(out)["rows"]
    assert every_page["kv_value_skipped_pct"] == 0.0
    assert 0.0 < sparse["kv_value_skipped_pct"] <= 100.0


def test_jsonl_one_object_per_row(tiny: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = bench(capsys, "-m", tiny, *FAST, "-d", "0,8", "-f", "jsonl")
    assert code == 0
    lines = [json.loads(line) for line in out.splitlines()]
    assert len(lines) == 2
    assert all(line["record"] == "result" and line["model"] and line["build"] for line in lines)
    assert [line["depth"] for line in lines] == [0, 8]


def test_csv_parses(tiny: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = bench(capsys, "-m", tiny, *FAST, "-d", "0,8", "-f", "csv")
    assert code == 0
    rows = list(csv.DictReader(io.StringIO(out)))
    assert len(rows) == 2
    assert {"engine", "isa", "kv", "depth", "pp_tok_s", "tg_tok_s_median", "cpu"} <= set(rows[0])
    assert float(rows[1]["tg_tok_s"]) > 0


def test_markdown_table(tiny: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = bench(capsys, "-m", tiny, *FAST, "-d", "0,8", "--kv", "fp16,turbo", "-f", "md")
    assert code == 0
    assert out.startswith("`spinkv bench ")
    assert "- CPU: " in out and "- build: " in out
    table = [line for line in out.splitlines() if line.startswith("|")]
    assert len(table) == 2 + 4  # header, separator, one row per (kv, depth)
    widths = {line.count("|") for line in table}
    assert len(widths) == 1
    assert "pp8 t/s" in table[0] and "tg4 t/s" in table[0]


def test_rich_table_default(tiny: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = bench(capsys, "-m", tiny, *FAST)
    assert code == 0
    assert "CPU: " in out and "threads: " in out and "tg4 t/s" in out


# ---- comma lists ------------------------------------------------------------------------------


def test_comma_lists_expand_into_rows(tiny: str, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["-p", "4,8", "-n", "2,3", "-d", "0,8", "--kv", "fp16,turbo", "-r", "2", "-f", "json"]
    code, out, _ = bench(capsys, "-m", tiny, *args)
    assert code == 0
    rows = json.loads(out)["rows"]
    keys = [(r["kv"], r["depth"], r["n_prompt"], r["n_gen"]) for r in rows]
    assert len(keys) == 16 and len(set(keys)) == 16
    assert set(keys) == {
        (kv, d, p, n) for kv in ("fp16", "turbo") for d in (0, 8) for p in (4, 8) for n in (2, 3)
    }
    assert all(r["reps"] == 2 for r in rows)
    # one fill per (kv, depth), shared by its (p, n) rows
    fills: dict[tuple[str, int], set[float]] = {}
    for r in rows:
        fills.setdefault((r["kv"], r["depth"]), set()).add(r["fill_tok_s"])
    assert all(len(f) == 1 for f in fills.values())


@pytest.mark.parametrize("preset", ["fp16", "turbo"])
def test_restore_returns_to_the_fill_exactly(
    tiny_model_dir: Path, native: ModuleType, preset: str
) -> None:
    engine = bm.SpinkvEngine(native.Model.load(str(tiny_model_dir)))
    arm = KvArm(preset, {"preset": preset})
    tokens = list(range(3, 300))
    bm.fill_context(engine, arm, tokens[:197])
    digest = engine.session.state_digest()
    case = bm.Case("any", arm, 197, 40, 60)
    first = bm.measure_rep(engine, case, tokens, bos=1)
    assert engine.session.state_digest() == digest
    second = bm.measure_rep(engine, case, tokens, bos=1)
    assert engine.session.state_digest() == digest
    assert first.generated == second.generated and len(first.generated) == 60


class _LoggedEngine:
    """An engine without timers or cache statistics (as llama.cpp's) that logs its name at
    every decode into a shared list: the order in which engines ran."""

    def __init__(self, name: str, log: list[str]) -> None:
        self.name, self._log = name, log

    def new_context(self, kv: Any) -> None: ...

    def prefill(self, tokens: list[int]) -> None: ...

    def greedy_next(self) -> int:
        return 7

    def decode(self, token: int) -> None:
        if not self._log or self._log[-1] != self.name:
            self._log.append(self.name)

    def mark(self) -> None: ...

    def restore(self) -> None: ...

    def timings(self) -> None:
        return None

    def reset_timings(self) -> None: ...

    def cache_stats(self) -> None:
        return None


@pytest.mark.parametrize("n_arms", [1, 2])
def test_llama_cpp_takes_turns_with_ours(n_arms: int) -> None:
    """Interleaved engines: after each of our repetitions, one of the twin on every
    companion; a companion's row pools its repetitions over our arms."""
    from spinkv.util.progress import Steps

    log: list[str] = []
    ours, theirs = _LoggedEngine("ours", log), _LoggedEngine("theirs", log)
    arms = [KvArm(p, {"preset": p}) for p in ("fp16", "turbo")[:n_arms]]
    cases = [bm.Case("any", arm, 16, 0, 4) for arm in arms]
    twin = bm.Case("llama", KvArm("f16", {}), 16, 0, 4)
    tokens, reps = list(range(3, 40)), 3
    companions = bm.Companions([(theirs, {16: [twin]})], tokens, 1, Steps())
    companions.fill(16)
    rows = list(bm.run_cases(ours, cases, reps, tokens, 1, Steps(), after_rep=companions.after))
    rows += list(companions.rows())
    # The companion's warm-up, then ours (warm-up and first repetition), then turns.
    assert log == ["theirs"] + ["ours", "theirs"] * reps * n_arms
    assert [(r["engine"], r["reps"]) for r in rows] == [("ours", reps)] * n_arms + [
        ("theirs", reps * n_arms)
    ]


def test_isa_list_gives_rows_per_isa(
    tiny: str, native: ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    before = native.isa()
    code, out, _ = bench(capsys, "-m", tiny, *FAST, "--isa", f"scalar,{before}", "-f", "json")
    assert code == 0
    isas = [r["isa"] for r in json.loads(out)["rows"]]
    assert isas == list(dict.fromkeys(["scalar", before]))
    assert native.isa() == before  # restored


def test_cases_drop_empty_combinations() -> None:
    settings = bm.BenchSettings(
        n_prompt=(0, 4),
        n_gen=(0, 2),
        depths=(0, 8),
        reps=1,
        isas=("scalar",),
        arms=(KvArm("fp16", {"preset": "fp16"}),),
    )
    cases = settings.cases()
    assert len(cases) == 2 * 3
    assert all(c.n_prompt or c.n_gen for c in cases)
    assert [c.depth for c in cases] == [0, 0, 0, 8, 8, 8]


def test_parse_int_list() -> None:
    assert bm.parse_int_list("512, 2048,512,", "-d") == (512, 2048)
    for bad in ("", "a", "-1", "1,,x"):
        with pytest.raises(bm.InvalidInputError):
            bm.parse_int_list(bad, "-d")


def test_codec_excess_estimate() -> None:
    attention = [1.0, 1.1, 0.9, 3.0, 1.0, 1.0, 2.0, 1.0]
    sealed = [False, False, False, True, False, False, True, False]
    assert bm.codec_excess_ms(attention, sealed) == pytest.approx(2.0 + 1.0)
    assert bm.codec_excess_ms(attention, [False] * 8) == 0.0


def test_summarize() -> None:
    assert bm.summarize([None, None]) is None
    mean, std, median = bm.summarize([1.0, 2.0, 6.0, None])  # type: ignore[misc]
    assert (mean, median) == (3.0, 2.0) and std == pytest.approx(2.6458, abs=1e-4)


def _row(engine: str, depth: int, pp: float, tg: float) -> dict[str, Any]:
    return {
        "engine": engine,
        "isa": "avx2" if engine == "spinkv" else "native",
        "kv": "fp16" if engine == "spinkv" else "f16",
        "depth": depth,
        "n_prompt": 8,
        "n_gen": 4,
        "fill_tok_s_median": None,
        "pp_tok_s_median": pp,
        "tg_tok_s_median": tg,
        "decode_tok_s_median": 1.0,
    }


def test_ratios_match_depth_prompt_and_gen() -> None:
    rows = [
        _row("spinkv", 8, 30.0, 6.0),
        _row("spinkv", 16, 1.0, 1.0),
        _row("llama.cpp", 8, 10.0, 3.0),
    ]
    (ratio,) = bm.ratios(rows)
    assert ratio["depth"] == 8
    assert ratio["pp_tok_s_ratio"] == 3.0 and ratio["tg_tok_s_ratio"] == 2.0
    assert ratio["fill_tok_s_ratio"] is None


def test_ratios_take_llama_cpp_at_its_best_f16_configuration_per_metric() -> None:
    fa_off = {**_row("llama.cpp", 8, 10.0, 4.0), "kv": "f16 fa-off"}
    fa_on = {**_row("llama.cpp", 8, 20.0, 2.0), "kv": "f16 fa-on"}
    q4 = {**_row("llama.cpp", 8, 100.0, 100.0), "kv": "q4_0 fa-on"}  # not an anchor
    (ratio,) = bm.ratios([_row("spinkv", 8, 40.0, 8.0), fa_off, fa_on, q4])
    assert ratio["pp_tok_s_ratio"] == 2.0 and ratio["pp_tok_s_reference"] == "f16 fa-on"
    assert ratio["tg_tok_s_ratio"] == 2.0 and ratio["tg_tok_s_reference"] == "f16 fa-off"


def test_llama_cpp_configurations() -> None:
    from spinkv.bench.llamacpp import configs_for, parse_kv_types

    labels = [c.label for c in configs_for(parse_kv_types("f16,q8_0"))]
    assert labels == ["f16 fa-off", "f16 fa-on", "q8_0 fa-on"]
    with pytest.raises(InvalidInputError, match="--llama-kv q3"):
        parse_kv_types("f16,q3")


# ---- bad values -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["-d", "-1"], "-d"),
        (["-d", "1,x"], "-d"),
        (["--isa", "nonsense"], "nonsense"),
        (["--isa", "neon"], "neon"),
        (["-r", "0"], "-r"),
        (["-p", "0", "-n", "0"], "-p and -n"),
        (["-f", "xml"], "xml"),
        (["--kv", "bogus"], "bogus"),
        (["-t", "0"], "-t"),
        (["-d", "100000"], "context"),
    ],
)
def test_bad_values_exit_2_in_one_line(
    tiny: str, capsys: pytest.CaptureFixture[str], args: list[str], fragment: str
) -> None:
    code, out, err = bench(capsys, "-m", tiny, *FAST, *args)
    assert code == 2
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert fragment in lines[0]
    assert out == ""


def test_compare_llama_cpp_needs_the_package(
    tiny: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # import llama_cpp -> ImportError
    code, _, err = bench(capsys, "-m", tiny, *FAST, "--compare-llama-cpp")
    assert code == 2
    assert err.count("\n") == 1 and "pip install llama-cpp-python" in err


# ---- kernel mode ------------------------------------------------------------------------------


def test_kernel_mode_rows(tiny: str, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["--kernels", "-d", "40", "-n", "70", "-r", "1", "--kv", "fp16,turbo", "-f", "json"]
    code, out, _ = bench(capsys, "-m", tiny, *args)
    assert code == 0
    record = json.loads(out)
    rows = {r["kv"]: r for r in record["rows"]}
    assert set(rows) == {"fp16", "turbo"}
    assert rows["fp16"]["attend_us"] > 0 and rows["fp16"]["scan_gb_s"] > 0
    assert rows["fp16"]["encode_ns_per_token"] is None
    assert any("simd128" in note for note in record["notes"])
    cases = record["kernel_cases"]  # the shared kernel cases, measured in this process
    isa = record["rows"][0]["isa"]
    scans = [c for c in cases if c["isa"] == isa and c["case"].startswith("key scan turbo")]
    assert scans and scans[0]["runtime"] == "native" and scans[0]["ns_per_token"] > 0
    assert any(c["case"].startswith("matvec") and c["ms"] > 0 for c in cases)


def test_kernel_mode_depths_are_bounded_by_the_context(
    tiny: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = bench(capsys, "-m", tiny, "--kernels", "-d", "99999999", "-n", "1", "-r", "1")
    assert code == 2 and "more than the model's context" in err


def test_native_kernel_bench_restores_the_isa(native: ModuleType) -> None:
    before = native.isa()
    lines = native.kernel_bench("scalar")
    assert native.isa() == before
    assert len(lines) >= 6 and all(line.startswith("scalar ") for line in lines)
    with pytest.raises(native.InvalidInputError, match="unknown ISA"):
        native.kernel_bench("bogus")


def test_native_read_bandwidth_checks_its_arguments(native: ModuleType) -> None:
    probe = native.read_bandwidth(64, 1)
    assert probe["gb_per_s"] > 0 and probe["buffer_bytes"] == 64 << 20 and probe["passes"] == 1
    for bad in [(1, 1), (64, 0), (-1, 1), (1 << 20, 1)]:
        with pytest.raises(native.InvalidInputError, match="bandwidth probe|must be"):
            native.read_bandwidth(*bad)
    with pytest.raises(native.InvalidInputError, match="mib must be"):
        native.read_bandwidth("lots")


# ---- llama.cpp, when installed ----------------------------------------------------------------


@pytest.fixture
def llama_cpp() -> ModuleType:
    return pytest.importorskip("llama_cpp")


def test_gguf_export_matches_our_logits(
    tiny_model_dir: Path, native: ModuleType, llama_cpp: ModuleType, tmp_path: Path
) -> None:
    import numpy as np
    from spinkv.bench.llamacpp import LlamaCppEngine
    from spinkv.models.gguf_export import cached_gguf

    path = cached_gguf(tiny_model_dir, tmp_path)
    assert cached_gguf(tiny_model_dir, tmp_path) == path  # cached
    tokens = [1, 50, 60, 70, 80, 90, 100, 33]
    theirs = LlamaCppEngine(path, n_ctx=64, threads=1)
    theirs.new_context(None)
    theirs.prefill(tokens)
    ours = native.Model.load(str(tiny_model_dir)).session()
    ours.prefill(tokens)
    logits = np.ctypeslib.as_array(theirs._llm._ctx.get_logits(), shape=(theirs._n_vocab,))
    np.testing.assert_allclose(logits, ours.logits(), atol=0.05)
    theirs.close()


@pytest.fixture
def one_thread(native: ModuleType) -> Iterator[None]:
    """-t 1 for one test (llama.cpp's spinning barriers crawl when 2 threads share a busy
    machine), then the thread count as it was."""
    before = native.threads()
    yield
    native.set_threads(before)


def test_compare_llama_cpp_prints_ratios(
    tiny: str,
    llama_cpp: ModuleType,
    spinkv_home: Path,
    one_thread: None,
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = [*FAST, "-t", "1", "-d", "0,8", "--compare-llama-cpp", "--llama-kv", "f16,q8_0"]
    code, out, _ = bench(capsys, "-m", tiny, *args, "-f", "json")
    assert code == 0
    record = json.loads(out)
    engines = [(r["engine"], r["kv"], r["depth"]) for r in record["rows"]]
    assert engines[:2] == [("spinkv", "turbo", 0), ("spinkv", "turbo", 8)]
    theirs = sorted(engines[2:])
    configs = ["f16 fa-off", "f16 fa-on"]
    assert theirs == sorted(("llama.cpp", kv, d) for kv in configs for d in (0, 8))
    # The tiny model's 16-wide heads cannot hold llama.cpp's 32-wide q8_0 cache blocks.
    assert any(n.startswith("llama.cpp q8_0 fa-on: not run") for n in record["notes"])
    assert [r["depth"] for r in record["ratios"]] == [0, 8]
    for ratio in record["ratios"]:
        assert ratio["tg_tok_s_ratio"] > 0 and ratio["pp_tok_s_ratio"] > 0
        assert ratio["tg_tok_s_reference"] in ("f16 fa-off", "f16 fa-on")
        # same weights, same f16 cache: the greedy tokens agree (ties aside, all of them)
        assert ratio["greedy_tokens"] == 4 and ratio["same_greedy_tokens"] >= 1
    assert "llama-cpp-python" in record["system"]["llama_cpp"]
    assert list((spinkv_home / "llama-cpp").glob("*.f16.gguf"))


def test_gguf_pre_tokenizer_tags() -> None:
    from spinkv.errors import UnsupportedError
    from spinkv.models.gguf_export import gguf_pre_tag
    from spinkv.models.gguf_import import LLAMA3_REGEX

    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "use_regex": True}
    assert gguf_pre_tag(byte_level) == "default"
    digits = {"type": "Digits", "individual_digits": True}
    assert gguf_pre_tag({"type": "Sequence", "pretokenizers": [digits, byte_level]}) == "smollm"
    split = {"type": "Split", "pattern": {"Regex": LLAMA3_REGEX}}
    raw = {**byte_level, "use_regex": False}
    assert gguf_pre_tag({"type": "Sequence", "pretokenizers": [split, raw]}) == "llama-bpe"
    with pytest.raises(UnsupportedError):
        gguf_pre_tag({"type": "Whitespace"})


def test_llama_cpp_tokenizes_our_export_like_we_do(
    default_model_dir: Path, llama_cpp: ModuleType, tmp_path: Path
) -> None:
    from spinkv.models.gguf_export import cached_gguf
    from spinkv.tokenizer import load_tokenizer

    text = Path("/usr/share/common-licenses/GPL-3").read_text()[:20000]
    ids = load_tokenizer(default_model_dir).encode(text)
    gguf = cached_gguf(default_model_dir, tmp_path)
    vocab = llama_cpp.Llama(str(gguf), n_ctx=64, vocab_only=True, verbose=False)
    assert vocab.tokenize(text.encode(), add_bos=False) == ids


def test_llama_kv_is_checked_and_needs_the_comparison(
    tiny: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = bench(capsys, "-m", tiny, "-p", "4", "-n", "2", "--llama-kv", "bogus")
    assert code == 2 and "bogus" in err
    code, _, err = bench(capsys, "-m", tiny, "-p", "4", "-n", "2", "--llama-kv", "q8_0")
    assert code == 2 and "needs --compare-llama-cpp" in err
