"""`spinkv eval --suite`: statistics against known cases, the preregistration file, the corpus
records, prompt building and scoring, paired generation, and the quick tier end to end on
the tiny random model. Figures on SmolLM2 come from the full tier, run by hand
(docs/KV_QUALITY.md)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest
from helpers import assert_one_line_error, spinkv_cli
from spinkv.cli.app import run_cli
from spinkv.errors import InvalidInputError
from spinkv.eval import corpus, families, prereg, scoring, verdict
from spinkv.eval import hypothesis as hyp
from spinkv.eval import suite as suite_mod
from spinkv.eval.arms import parse_arms
from spinkv.eval.paired import decode_reply, decodings, run_prompt

# ---- statistics against known cases --------------------------------------------------------


def test_holm_matches_hand_computed_values() -> None:
    # sorted: 0.005*4 = 0.02, 0.01*3 = 0.03, 0.03*2 = 0.06, 0.04*1 = 0.04 -> max(0.06, 0.04)
    assert hyp.holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert hyp.holm([0.5, 0.6]) == [1.0, 1.0]  # capped at 1, monotone
    assert hyp.holm([0.2]) == [0.2]
    assert hyp.holm([0.001, 0.001, 0.001]) == pytest.approx([0.003, 0.003, 0.003])


def test_permutation_on_identical_arms_gives_p_one() -> None:
    for n in (5, 40):  # exact enumeration and Monte Carlo
        assert hyp.sign_flip_p([0.0] * n, resamples=2000, seed=1) == 1.0


def test_permutation_exact_small_case() -> None:
    # 8 sign patterns of (1, 1, 1): only all-plus reaches mean 1; all-minus reaches |mean| 1
    assert hyp.sign_flip_p([1.0, 1.0, 1.0], alternative="greater") == pytest.approx(1 / 8)
    assert hyp.sign_flip_p([1.0, 1.0, 1.0]) == pytest.approx(2 / 8)
    assert hyp.sign_flip_p([-1.0, -1.0, -1.0], alternative="greater") == 1.0


def test_permutation_detects_a_real_shift_and_not_a_reversed_one() -> None:
    rng = np.random.default_rng(3)
    d = 0.5 + rng.normal(0.0, 0.3, size=30)
    assert hyp.sign_flip_p(d, resamples=5000, seed=2) < 0.001
    assert hyp.sign_flip_p(d, alternative="greater", resamples=5000, seed=2) < 0.001
    assert hyp.sign_flip_p(-d, alternative="greater", resamples=5000, seed=2) > 0.99
    noise = rng.normal(0.0, 1.0, size=30)
    assert hyp.sign_flip_p(noise - noise.mean(), resamples=5000, seed=2) > 0.9


def test_bootstrap_ci_covers_the_true_mean() -> None:
    rng = np.random.default_rng(5)
    covered = 0
    for trial in range(100):
        sample = rng.normal(2.0, 1.0, size=200)
        mean, lo, hi = hyp.bootstrap_mean(sample, resamples=500, seed=trial)
        assert lo <= mean <= hi
        assert mean == pytest.approx(sample.mean())
        covered += lo <= 2.0 <= hi
    assert 85 <= covered <= 100  # nominal 95 %
    assert hyp.bootstrap_mean([3.0, 3.0, 3.0], resamples=100, seed=0) == (3.0, 3.0, 3.0)


# ---- the preregistration -------------------------------------------------------------------


def test_shipped_preregistration_is_complete() -> None:
    pre = prereg.load()
    assert pre.version >= 1 and pre.alpha == 0.05
    assert set(pre.holm_family) <= set(pre.budgets)
    assert "ordinary_chat.chrf" in pre.holm_family  # the ordinary-chat regression budget
    assert verdict.check_budgets_known(pre, suite_mod.known_metrics()) == []
    assert {"quick", "full"} <= set(pre.tiers)
    full = pre.tier("full")
    assert full.prompts_per_family >= 20 and len(full.sampled_seeds) >= 2
    assert full.corpus_texts == 0  # every corpus text
    with pytest.raises(InvalidInputError, match="unknown suite tier 'huge'"):
        pre.tier("huge")


GOOD = prereg.DEFAULT_PATH.read_text()


@pytest.mark.parametrize(
    "edit, fragment",
    [
        (lambda s: s.replace("alpha = 0.05", "alpha = 0.7"), "statistics.alpha must be in"),
        (lambda s: s.replace("version = 1", 'version = "one"'), "version must be an integer"),
        (lambda s: s.replace("[statistics]", "[statistics"), "not valid TOML"),
        (
            lambda s: s.replace('"corpus.ppl_delta_pct",\n]', '"corpus.nothing",\n]'),
            "holm_family names metrics without a budget: corpus.nothing",
        ),
        (lambda s: s.replace('rule = "max"', 'rule = "most"', 1), "rule must be one of"),
        (
            lambda s: s.replace("sampled_seeds = [1, 2]", "sampled_seeds = [1]", 1),
            "sampled_seeds must list at least 2 distinct seeds",
        ),
        (lambda s: s.replace("bar_fraction = 0.5", "bar_fraction = 1.5", 1), "must be in [0, 1]"),
        (lambda s: s.replace('reference = "fp16"', 'reference = "turbo"'), "reference must be"),
    ],
)
def test_bad_preregistration_is_one_clear_error(tmp_path: Path, edit: Any, fragment: str) -> None:
    bad = tmp_path / "prereg.toml"
    changed = edit(GOOD)
    assert changed != GOOD
    bad.write_text(changed)
    with pytest.raises(InvalidInputError) as info:
        prereg.load(bad)
    message = str(info.value)
    assert fragment in message and "\n" not in message and str(bad) in message


def test_budget_for_an_unknown_metric_is_refused(tmp_path: Path) -> None:
    bad = tmp_path / "prereg.toml"
    bad.write_text(GOOD + '\n[budgets."code.style"]\nrule = "min"\nvalue = 1\n')
    settings = suite_mod.SuiteSettings(arms=parse_arms("turbo"), prereg_path=bad)
    with pytest.raises(InvalidInputError, match="does not compute: code.style"):
        suite_mod.load_prereg(settings)


def test_cli_bad_preregistration_and_tier_are_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text(GOOD.replace("alpha = 0.05", "alpha = -1"))
    assert_one_line_error(
        spinkv_cli("eval", "--suite", "quick", "--prereg", str(bad)), "statistics.alpha"
    )
    assert_one_line_error(
        spinkv_cli("eval", "--suite", "quick", "--prereg", str(tmp_path / "none.toml")),
        "cannot read preregistration",
    )
    assert_one_line_error(spinkv_cli("eval", "--suite", "medium"), "unknown suite tier")
    assert_one_line_error(
        spinkv_cli("eval", "--suite", "quick", "--only", "kld"), "choose from corpus, tasks"
    )


# ---- the corpus ----------------------------------------------------------------------------


def test_corpus_is_diverse_and_recorded() -> None:
    assert len(corpus.TEXTS) >= 10
    assert {t.kind for t in corpus.TEXTS} >= {"legal", "prose", "technical", "code", "table"}
    assert len({t.sha256 for t in corpus.TEXTS}) == len(corpus.TEXTS)
    assert [t.name for t in corpus.TEXTS if not t.held_out] == ["gpl-3"]
    for entry in corpus.TEXTS:
        assert entry.path.is_absolute() and len(entry.sha256) == 64


def test_corpus_texts_load_when_present() -> None:
    problems = corpus.missing()
    if problems:
        pytest.skip(problems[0])
    for entry in corpus.TEXTS:
        assert len(corpus.load_text(entry)) > 3000, entry.name


def test_missing_or_changed_text_is_one_line(tmp_path: Path) -> None:
    gone = corpus.CorpusText("gone", "prose", tmp_path / "gone.txt", "0" * 64, "nowhere")
    with pytest.raises(InvalidInputError, match="corpus text gone is missing") as info:
        corpus.load_text(gone)
    assert "\n" not in str(info.value)
    changed_path = tmp_path / "t.txt"
    changed_path.write_text("some text")
    changed = corpus.CorpusText("t", "prose", changed_path, "0" * 64, "nowhere")
    with pytest.raises(InvalidInputError, match="corpus text t changed"):
        corpus.load_text(changed)
    right = corpus.CorpusText("t", "prose", changed_path, corpus.sha256_of(changed_path), "x")
    assert corpus.load_text(right) == "some text"


# ---- answers and reply comparison ----------------------------------------------------------


def _prompt(answer: str, kind: str, distractor: str | None = None) -> families.TaskPrompt:
    return families.TaskPrompt("x", 0, "t", [], 4, [1], answer, kind, distractor)


def test_exact_match_rules() -> None:
    port = _prompt("22", "number", "17")
    assert families.is_correct(port, "22")
    assert families.is_correct(port, "The port is 22.")
    assert not families.is_correct(port, "17, not 22")  # the first number counts
    assert not families.is_correct(port, "221")
    country = _prompt("New Zealand", "text", "Niue")
    assert families.is_correct(country, "It is new  zealand.")
    assert families.is_correct(country, "New Zealand (not Niue)")
    assert not families.is_correct(country, "Niue, or New Zealand")
    assert not families.is_correct(country, "Australia")
    assert families.extracted_answer(port, "port 22/tcp") == "22"
    assert families.extracted_answer(country, "New Zealand.\nMore") == "new zealand"


def test_compare_replies() -> None:
    pytest.importorskip("sacrebleu")
    same = scoring.compare([1, 2, 3], [1, 2, 3], "a b c", "a b c")
    assert same == {
        "agree_tokens": 3,
        "identical": True,
        "agreement": 1.0,
        "first_divergence": None,
        "chrf": 100.0,
    }
    diff = scoring.compare([1, 2, 3, 4], [1, 2, 9], "The port is 22.", "The port is 23.")
    assert diff["agree_tokens"] == 2 and diff["first_divergence"] == 2
    assert diff["agreement"] == 0.5
    assert 50.0 < diff["chrf"] < 100.0
    unrelated = scoring.chrf("zzzz qqqq", "The port is 22.")
    assert unrelated < diff["chrf"]
    assert scoring.reseed_floor(["a b c", "a b c"]) == 100.0


# ---- decisions -----------------------------------------------------------------------------


def _units(metric: str, arm: list[float], ref: list[float], **kw: Any) -> verdict.Units:
    return verdict.Units(metric, arm, ref, **kw)


def test_decision_ship_no_ship_incomplete() -> None:
    pre = prereg.load()
    n = 20
    good: dict[str, Any] = {}
    corpus_values = {"corpus.kld_mean": 0.005, "corpus.ppl_delta_pct": 0.2, "corpus.top1": 0.97}
    for metric, rule in pre.budgets.items():
        if metric.startswith("corpus."):
            value = corpus_values[metric]
            u = _units(metric, [value] * 12, [0.0] * 12, pooled=value, unit="text")
        elif rule.kind == "reseed_bar":
            u = _units(metric, [95.0] * n, [100.0] * n, floor=[40.0] * n)
        elif rule.kind == "min":
            u = _units(metric, [1.0] * n, [1.0] * n)
        else:
            u = _units(metric, [0.8] * n, [0.8] * n)
        good[metric] = verdict.evaluate(u, rule, pre, seed=1)
    assert verdict.decide(good, pre)["verdict"] == "SHIP"
    # one family outside its budget (every answer lost): NO-SHIP, named
    worse = dict(good)
    metric = "current_turn.exact_match"
    worse[metric] = verdict.evaluate(
        _units(metric, [0.0] * n, [0.8] * n), pre.budgets[metric], pre, seed=1
    )
    decision = verdict.decide(worse, pre)
    assert decision["verdict"] == "NO-SHIP"
    assert any(r.startswith(metric) for r in decision["reasons"])
    assert worse[metric]["within_budget"] is False and worse[metric]["p_noninferior"] > 0.5
    # a budgeted metric not measured (a Holm one, or only a stop-rule one): no decision
    partial = {k: v for k, v in good.items() if not k.startswith("corpus.")}
    assert verdict.decide(partial, pre)["verdict"] == "INCOMPLETE"
    no_code = {k: v for k, v in good.items() if k != "code.chrf"}
    decision = verdict.decide(no_code, pre)
    assert decision["verdict"] == "INCOMPLETE" and "code.chrf" in decision["reasons"][0]


def test_reseed_bar_is_halfway_from_the_floor_to_identity() -> None:
    pre = prereg.load()
    rule = pre.budgets["ordinary_chat.chrf"]
    units = _units("ordinary_chat.chrf", [70.0, 60.0], [100.0, 100.0], floor=[40.0, 20.0])
    assert verdict.excess(units, rule).tolist() == [0.0, 0.0]  # bars 70 and 60
    row = verdict.evaluate(units, rule, pre, seed=0)
    assert row["bar"] == pytest.approx(65.0) and row["within_budget"]


# ---- on the tiny model ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_loaded(tiny_model_dir: Path, native: ModuleType) -> Any:
    import spinkv.api as api

    return api.load(str(tiny_model_dir))


@pytest.fixture(scope="module")
def need_texts() -> None:
    problems = corpus.missing(families.SOURCE_TEXTS)
    if problems:
        pytest.skip(problems[0])


def test_prompts_fit_and_carry_their_answers(tiny_loaded: Any, need_texts: None) -> None:
    pre = prereg.load()
    full = pre.tier("full")
    prompts = suite_mod.build_prompts(tiny_loaded, pre, full, pre.seed)
    by_family = {f: [p for p in prompts if p.family == f] for f in families.FAMILIES}
    assert all(len(v) == full.prompts_per_family for v in by_family.values())
    for p in prompts:
        assert len(p.token_ids) <= (p.context_limit or tiny_loaded.max_context)
        rendered = tiny_loaded.detokenize(p.token_ids, skip_special_tokens=False)
        if p.family in ("long_retrieval", "current_turn") and p.answer_kind == "number":
            assert p.answer in rendered  # the answer is in the context, not invented
        if p.distractor is not None:
            assert p.distractor != p.answer
    for p in by_family["boundary"]:
        assert 0 <= p.meta["margin"] <= max(families.BOUNDARY_MARGINS)
    again = suite_mod.build_prompts(tiny_loaded, pre, full, pre.seed)
    assert [p.token_ids for p in again] == [p.token_ids for p in prompts]  # seeded


def test_replies_after_rollback_equal_fresh_sessions(tiny_loaded: Any, need_texts: None) -> None:
    pre = prereg.load()
    tier = pre.tier("quick")
    prompt = suite_mod.build_prompts(tiny_loaded, pre, tier, pre.seed)[0]
    decs = decodings(pre, tier)
    assert [d.name for d in decs] == ["greedy", "seed1", "seed2"]
    kv = {"preset": "turbo", "window": 0}
    shared = run_prompt(tiny_loaded, prompt, kv, decs)
    eos = frozenset(tiny_loaded.tokenizer.eos_token_ids)
    for dec in decs:
        fresh = tiny_loaded.native.session(kv)
        fresh.prefill(prompt.token_ids)
        tokens, finish = decode_reply(
            fresh, dec.sampling.to_native(), prompt.max_tokens, eos, tiny_loaded.max_context
        )
        assert (tokens, finish) == (shared[dec.name].tokens, shared[dec.name].finish)


def test_boundary_replies_stop_at_the_context_limit(tiny_loaded: Any, need_texts: None) -> None:
    pre = prereg.load()
    tier = pre.tier("full")
    prompts = [
        p for p in suite_mod.build_prompts(tiny_loaded, pre, tier, 7) if p.family == "boundary"
    ]
    decs = decodings(pre, tier)[:1]
    finishes = []
    for p in prompts[:6]:  # margins 0, 1, 2, 3, 5, 8
        reply = run_prompt(tiny_loaded, p, {"preset": "fp16"}, decs)["greedy"]
        room = p.context_limit - len(p.token_ids)  # the cache fills up after room + 1 tokens
        assert len(reply.tokens) <= room + 1
        if reply.finish == "context":
            assert len(reply.tokens) == room + 1
        finishes.append(reply.finish)
    assert "context" in finishes


def _check_suite_record(record: dict[str, Any], labels: list[str]) -> None:
    assert record["schema"] == suite_mod.SCHEMA
    assert [a["label"] for a in record["arms"]] == labels
    assert record["preregistration"]["sha256"] == prereg.load().sha256
    c = record["corpus"]
    assert len(c["texts"]) == 3 and c["held_out"] == ["apache-2.0", "mpl-2.0"]
    tasks = record["tasks"]
    assert tasks["decodings"] == ["greedy", "seed1", "seed2"]
    assert {p["family"] for p in tasks["prompts"]} == set(families.FAMILIES)
    for label in labels:
        arm = record["summary"][label]
        assert arm["verdict"] in ("SHIP", "NO-SHIP", "INCOMPLETE")
        assert [h["metric"] for h in arm["holm"]] == list(record["preregistration"]["holm_family"])
        for name, row in arm["metrics"].items():
            assert row["arm"]["lo"] <= row["arm"]["value"] <= row["arm"]["hi"], name
            assert 0.0 < row["p_difference"] <= 1.0
            if "budget" in row:
                assert 0.0 < row["p_noninferior"] <= 1.0


def test_suite_quick_tier_end_to_end(tiny_loaded: Any, need_texts: None) -> None:
    pytest.importorskip("sacrebleu")
    if corpus.missing():
        pytest.skip(corpus.missing()[0])
    settings = suite_mod.SuiteSettings(arms=parse_arms("fp16,turbo:window=0"), tier="quick")
    record = json.loads(json.dumps(suite_mod.evaluate_suite(tiny_loaded, settings)))
    labels = ["turbo:window=0"]  # fp16 is the reference, not an arm
    _check_suite_record(record, labels)
    pooled = record["corpus"]["pooled"]["turbo:window=0"]
    assert pooled["kld_mean"] > 1e-6 and pooled["bits_beyond_window"] < 16
    # fp16 against itself: every delta 0, every p(difference) 1, chrF 100, inside budgets;
    # two prompts a family cannot show non-inferiority, so the quick tier never SHIPs
    self_run = suite_mod.evaluate_suite(
        tiny_loaded, suite_mod.SuiteSettings(arms=parse_arms("fp16"), tier="quick")
    )
    fp16 = self_run["summary"]["fp16"]
    for name, row in fp16["metrics"].items():
        assert row["delta"]["value"] == 0.0, name
        assert row["p_difference"] == 1.0, name
        assert row.get("within_budget", True), name
    assert fp16["metrics"]["code.chrf"]["arm"]["value"] == 100.0
    assert fp16["verdict"] == "NO-SHIP"
    assert all("non-inferiority not shown" in r for r in fp16["reasons"])


def test_cli_suite_json_tables_and_plots(
    tiny_model_dir: Path,
    native: ModuleType,
    need_texts: None,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    pytest.importorskip("sacrebleu")
    pytest.importorskip("matplotlib")
    if corpus.missing():
        pytest.skip(corpus.missing()[0])
    base = ["eval", "-m", str(tiny_model_dir), "--suite", "quick", "--kv", "kivi2:window=0"]
    code = run_cli([*base, "--json", "--plot", str(tmp_path / "plots"), "--tokens", "64"])
    out = capsys.readouterr().out
    assert code == 0
    record = json.loads(out)
    assert record["corpus"]["tokens"] == 64
    for name in ("pareto.png", "depth.png", "families.png"):
        assert (tmp_path / "plots" / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    code = run_cli([*base, "--only", "tasks", "--bootstrap-seed", "3"])
    out = capsys.readouterr().out
    assert code == 0
    assert "preregistered decision" in out and "not measured" in out  # no corpus part
    verdict_line = record["summary"]["kivi2:window=0"]["verdict"]
    assert verdict_line in ("NO-SHIP", "INCOMPLETE") and verdict_line in out
    assert "teacher-forced" not in out
    assert math.isfinite(
        record["summary"]["kivi2:window=0"]["metrics"]["code.chrf"]["arm"]["value"]
    )


def test_merged_part_records_decide_like_one_run(
    tiny_model_dir: Path,
    native: ModuleType,
    need_texts: None,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    pytest.importorskip("sacrebleu")
    if corpus.missing():
        pytest.skip(corpus.missing()[0])
    base = ["eval", "-m", str(tiny_model_dir), "--suite", "quick", "--kv", "turbo:window=0"]
    records = {}
    for only in ("corpus", "tasks", "corpus,tasks"):
        assert run_cli([*base, "--only", only, "--json"]) == 0
        records[only] = capsys.readouterr().out
        (tmp_path / f"{only}.json").write_text(records[only])
    merge = f"{tmp_path / 'corpus.json'},{tmp_path / 'tasks.json'}"
    assert run_cli(["eval", "--suite", "quick", "--merge", merge, "--json"]) == 0
    merged = json.loads(capsys.readouterr().out)
    whole = json.loads(records["corpus,tasks"])
    assert merged["summary"] == whole["summary"]
    assert merged["corpus"] == whole["corpus"] and merged["tasks"] == whole["tasks"]
    # the same part twice, or a record that is not one, is refused in one line
    twice = f"{tmp_path / 'tasks.json'},{tmp_path / 'tasks.json'}"
    assert run_cli(["eval", "--suite", "quick", "--merge", twice]) == 2
    assert "arm turbo:window=0 has the tasks part twice" in capsys.readouterr().err
    (tmp_path / "junk.json").write_text("[1, 2]")
    assert run_cli(["eval", "--suite", "quick", "--merge", str(tmp_path / "junk.json")]) == 2
    assert "not a JSON suite record" in capsys.readouterr().err


def test_merge_adds_an_arm_measured_later(
    tiny_model_dir: Path,
    native: ModuleType,
    need_texts: None,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    pytest.importorskip("sacrebleu")
    if corpus.missing():
        pytest.skip(corpus.missing()[0])
    base = ["eval", "-m", str(tiny_model_dir), "--suite", "quick", "--json"]
    files = []
    for kv, only in (("turbo:window=0", "corpus,tasks"), ("kivi2:window=0", "tasks")):
        assert run_cli([*base, "--kv", kv, "--only", only]) == 0
        files.append(tmp_path / f"{len(files)}.json")
        files[-1].write_text(capsys.readouterr().out)
    assert (
        run_cli(["eval", "--suite", "quick", "--json", "--merge", ",".join(map(str, files))]) == 0
    )
    merged = json.loads(capsys.readouterr().out)
    assert [a["label"] for a in merged["arms"]] == ["turbo:window=0", "kivi2:window=0"]
    alone = json.loads(files[0].read_text())
    assert merged["summary"]["turbo:window=0"] == alone["summary"]["turbo:window=0"]
    later = merged["summary"]["kivi2:window=0"]
    assert "corpus.kld_mean" not in later["metrics"] and later["verdict"] != "SHIP"
    assert set(merged["tasks"]["prompts"][0]["arms"]) == {"turbo:window=0", "kivi2:window=0"}


def test_families_run_apart_merge_into_the_whole(
    tiny_model_dir: Path,
    native: ModuleType,
    need_texts: None,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    pytest.importorskip("sacrebleu")
    base = ["eval", "-m", str(tiny_model_dir), "--suite", "quick", "--kv", "turbo:window=0"]
    base += ["--only", "tasks", "--json"]
    halves = ("ordinary_chat,long_retrieval,source_conflict,current_turn", "code,boundary")
    files = []
    for families_arg in ("", *halves):
        extra = ["--families", families_arg] if families_arg else []
        assert run_cli([*base, *extra]) == 0
        files.append(tmp_path / f"{len(files)}.json")
        files[-1].write_text(capsys.readouterr().out)
    half = json.loads(files[2].read_text())
    assert {p["family"] for p in half["tasks"]["prompts"]} == {"code", "boundary"}
    merge = f"{files[1]},{files[2]}"
    assert run_cli(["eval", "--suite", "quick", "--merge", merge, "--json"]) == 0
    merged = json.loads(capsys.readouterr().out)
    whole = json.loads(files[0].read_text())
    wanted = [p for p in whole["tasks"]["prompts"] if p["family"] not in half_missing()]
    assert merged["tasks"]["prompts"] == wanted
    assert run_cli([*base, "--families", "poetry"]) == 2
    assert "unknown task family poetry" in capsys.readouterr().err


def half_missing() -> set[str]:
    """The families the two halves above leave out."""
    return {"summarization", "repeated_topic"}


def test_llamacpp_reference_rows_merge_into_tables_and_plot(
    tiny_model_dir: Path,
    native: ModuleType,
    need_texts: None,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """llama.cpp's rows are computed like the corpus part (same positions, same statistics),
    kept apart from the arms by --merge, shown in the pooled table and on the Pareto plot."""
    pytest.importorskip("matplotlib")
    if corpus.missing():
        pytest.skip(corpus.missing()[0])
    from spinkv.eval import llamacpp_ref
    from spinkv.eval import stats as eval_stats

    base = ["eval", "-m", str(tiny_model_dir), "--suite", "quick", "--kv", "turbo:window=0"]
    assert run_cli([*base, "--only", "corpus", "--json"]) == 0
    suite_record = json.loads(capsys.readouterr().out)
    pre = prereg.load()
    tier = pre.tier("quick")
    rng = np.random.default_rng(7)
    texts = []
    for entry in suite_mod.corpus_texts(tier):
        ids = list(rng.integers(0, 50, size=40))
        logits = rng.normal(size=(40, 50))
        noisy = logits + rng.normal(scale=0.5, size=logits.shape)
        texts.append((entry, ids, logits, {"q8_0": logits.copy(), "q4_0": noisy}))
    rows, pooled = llamacpp_ref.summarise(texts, ["q8_0", "q4_0"], 16, pre)
    # identical logits: nothing lost; perturbed ones: the suite's own statistics
    assert pooled["q8_0"]["kld_mean"] == 0.0 and pooled["q8_0"]["top1"] == 1.0
    assert pooled["q8_0"]["ppl_delta_pct"] == pytest.approx(0.0, abs=1e-9)
    entry, ids, logits, by_kind = texts[1]
    expected = eval_stats.compare_rows(logits[16:-1], by_kind["q4_0"][16:-1], ids[17:])
    assert rows[1]["arms"]["q4_0"]["kld_mean"]["value"] == pytest.approx(expected["kld"].mean())
    held = [t for t in texts if t[0].held_out]
    assert len(pooled["q4_0"]["units"]["kld_mean"]) == len(held) < len(texts)
    reference = {
        "schema": llamacpp_ref.SCHEMA,
        "engine": "llama.cpp (test)",
        "tier": "quick",
        "tokens": suite_record["corpus"]["tokens"],
        "skip": suite_record["corpus"]["skip"],
        "texts": rows,
        "pooled": pooled,
    }
    (tmp_path / "suite.json").write_text(json.dumps(suite_record))
    (tmp_path / "ref.json").write_text(json.dumps(reference))
    merge = f"{tmp_path / 'suite.json'},{tmp_path / 'ref.json'}"
    plots = tmp_path / "plots"
    assert run_cli(["eval", "--suite", "quick", "--merge", merge, "--plot", str(plots)]) == 0
    out = capsys.readouterr().out
    assert "llama.cpp q4_0 (reference)" in out and "llama.cpp q8_0 (reference)" in out
    assert (plots / "pareto.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert run_cli(["eval", "--suite", "quick", "--merge", merge, "--json"]) == 0
    merged = json.loads(capsys.readouterr().out)
    assert [r["label"] for r in merged["references"]] == ["llama.cpp q8_0", "llama.cpp q4_0"]
    assert list(merged["summary"]) == ["turbo:window=0"]  # references are never decided on
    assert merged["summary"] == suite_record["summary"]
    from spinkv.eval.suite_plot import pareto_points

    assert ("llama.cpp q4_0", 4.5) in [(p[0], p[1]) for p in pareto_points(merged)]
    # rows from another corpus are refused in one line
    (tmp_path / "other.json").write_text(json.dumps({**reference, "skip": 3}))
    other = f"{tmp_path / 'suite.json'},{tmp_path / 'other.json'}"
    assert run_cli(["eval", "--suite", "quick", "--merge", other]) == 2
    assert "reference rows are on another corpus" in capsys.readouterr().err


def test_llamacpp_reference_bad_input_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    from spinkv.eval import llamacpp_ref

    assert llamacpp_ref.main(["model.gguf", "--kv", "q3"]) == 2
    assert "--kv 'q3': choose from" in capsys.readouterr().err
    assert llamacpp_ref.main(["/nonexistent/model.gguf"]) == 2
    assert "no such GGUF file" in capsys.readouterr().err


def test_kv_study_codebooks_and_rotation() -> None:
    """The study's sphere codebook is turbo's law (Gaussian Lloyd–Max distortion for large d),
    Lloyd on samples of that law finds the same levels, the rotation keeps z at unit RMS."""
    from spinkv.eval import kv_study

    gaussian_mse = {2: 0.1175, 3: 0.03454, 4: 0.009497}  # Max (1960)
    rng = np.random.default_rng(3)
    samples = rng.standard_normal(400_000)
    for bits, mse in gaussian_mse.items():
        levels = kv_study.sphere_codebook(4096, bits)
        assert np.allclose(levels, -levels[::-1], atol=5e-3)  # cells snap to a 0.0007 grid
        measured = np.mean((samples - kv_study.quantize(samples, levels)) ** 2)
        assert measured == pytest.approx(mse, rel=0.03)
        fitted = kv_study.lloyd(samples, bits, init=levels.copy())  # a fixed point of the law
        assert np.allclose(fitted, levels, atol=0.03)
    d = 64
    h = kv_study.hadamard(d)
    assert np.allclose(h @ h.T, np.eye(d))
    rows = rng.normal(size=(10, d)) * np.linspace(0.1, 10, d)  # one strong channel
    z = kv_study.rotated_unit(rows, rng.choice([-1.0, 1.0], size=d), h)
    assert np.allclose(np.mean(z**2, axis=-1), 1.0)


def test_corpus_texts_run_apart_merge_into_the_whole(
    tiny_model_dir: Path,
    native: ModuleType,
    need_texts: None,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    if corpus.missing():
        pytest.skip(corpus.missing()[0])
    base = ["eval", "-m", str(tiny_model_dir), "--suite", "quick", "--kv", "turbo:window=0"]
    base += ["--only", "corpus", "--json"]
    records = {}
    for texts in (None, "mpl-2.0", "gpl-3,apache-2.0"):
        assert run_cli([*base, *(["--texts", texts] if texts else [])]) == 0
        records[texts] = capsys.readouterr().out
        (tmp_path / f"{str(texts).replace(',', '+')}.json").write_text(records[texts])
    whole = json.loads(records[None])
    merge = f"{tmp_path / 'mpl-2.0.json'},{tmp_path / 'gpl-3+apache-2.0.json'}"
    assert run_cli(["eval", "--suite", "quick", "--merge", merge, "--json"]) == 0
    merged = json.loads(capsys.readouterr().out)
    assert merged["corpus"]["texts"] == whole["corpus"]["texts"]  # corpus order, same rows
    assert merged["corpus"]["held_out"] == whole["corpus"]["held_out"]
    label = "turbo:window=0"
    got, want = merged["corpus"]["pooled"][label], whole["corpus"]["pooled"][label]
    for key in ("kld_mean", "top1", "ppl_delta_pct", "bits_all_in", "bits_beyond_window"):
        assert got[key] == pytest.approx(want[key], rel=1e-12), key
    for key, values in want["units"].items():
        assert got["units"][key] == pytest.approx(values, rel=1e-12), key
    assert got["depth_curve"]["kld_mean"] == pytest.approx(want["depth_curve"]["kld_mean"])
    assert merged["summary"][label]["verdict"] == whole["summary"][label]["verdict"]
    # a text outside the tier, or an unknown one, is one line before the model loads
    assert run_cli([*base, "--texts", "services"]) == 2
    assert "not in the quick tier's corpus" in capsys.readouterr().err
    assert run_cli([*base, "--texts", "nope"]) == 2
    assert "unknown corpus text nope" in capsys.readouterr().err


def test_merging_an_incomplete_record_is_an_input_error(
    tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    partial = tmp_path / "partial.json"
    partial.write_text(json.dumps({"schema": "spinkv.eval.suite/1"}))
    args = ["eval", "-m", str(tiny_model_dir), "--suite", "quick", "--merge", str(partial)]
    assert run_cli(args) == 2
    assert "is not a complete suite record" in capsys.readouterr().err
