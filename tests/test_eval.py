"""`spinkv eval`: metric math, KV arm parsing, passkey prompts, the decode path, the record.

Model-level runs here use the tiny random model only; quality figures on SmolLM2 are measured
by hand (docs/KV_QUALITY.md)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest
from spinkv.cli.app import run_cli
from spinkv.errors import InvalidInputError
from spinkv.eval import passkey
from spinkv.eval import runner as ev
from spinkv.eval import stats as eval_stats
from spinkv.eval.arms import parse_arms
from spinkv.eval.command import select_parts

# ---- metric math ----------------------------------------------------------------------------


def random_logits(rows: int, vocab: int, seed: int = 0, scale: float = 3.0) -> np.ndarray:
    return np.random.default_rng(seed).normal(0.0, scale, size=(rows, vocab)).astype(np.float32)


def test_log_softmax_is_float64_and_normalised() -> None:
    lp = eval_stats.log_softmax(random_logits(4, 50))
    assert lp.dtype == np.float64
    np.testing.assert_allclose(np.exp(lp).sum(axis=1), 1.0, atol=1e-12)


def test_identical_arms_have_zero_kld_and_full_agreement() -> None:
    logits = random_logits(100, 64)
    targets = list(np.random.default_rng(1).integers(0, 64, size=100))
    series = eval_stats.PositionSeries()
    series.extend(logits, logits.copy(), targets)
    assert len(series) == 100
    arrays = series.arrays()
    assert np.all(arrays["kld"] == 0.0)
    assert arrays["top1"].all()
    np.testing.assert_array_equal(arrays["nll_ref"], arrays["nll_arm"])
    summary = eval_stats.paired_bootstrap(arrays, resamples=200)
    assert summary["kld_mean"] == {"value": 0.0, "lo": 0.0, "hi": 0.0}
    assert summary["top1"]["value"] == 1.0
    assert summary["ppl_delta_pct"]["value"] == 0.0
    assert summary["ppl_delta_pct"]["lo"] == summary["ppl_delta_pct"]["hi"] == 0.0


def test_kld_matches_the_definition_and_a_perturbation_is_positive() -> None:
    ref = random_logits(40, 30, seed=2)
    arm = ref + random_logits(40, 30, seed=3, scale=0.3)
    targets = list(range(40))
    targets = [t % 30 for t in targets]
    rows = eval_stats.compare_rows(ref, arm, targets)
    p = np.exp(ref.astype(np.float64))
    p /= p.sum(axis=1, keepdims=True)
    q = np.exp(arm.astype(np.float64))
    q /= q.sum(axis=1, keepdims=True)
    expected = (p * np.log(p / q)).sum(axis=1)
    np.testing.assert_allclose(rows["kld"], expected, rtol=1e-9, atol=1e-12)
    assert np.all(rows["kld"] > 0.0)
    np.testing.assert_allclose(rows["nll_ref"], -np.log(p[np.arange(40), targets]), rtol=1e-9)
    # a bigger perturbation gives a bigger divergence
    worse = eval_stats.compare_rows(ref, ref + random_logits(40, 30, seed=3, scale=1.0), targets)
    assert worse["kld"].mean() > rows["kld"].mean()


def test_bootstrap_ci_brackets_the_point_estimate_and_is_deterministic() -> None:
    rng = np.random.default_rng(4)
    n = 500
    series: dict[str, np.ndarray] = {
        "kld": rng.exponential(0.02, size=n),
        "top1": rng.random(n) < 0.9,
        "nll_ref": rng.exponential(3.0, size=n),
    }
    series["nll_arm"] = series["nll_ref"] + rng.normal(0.02, 0.1, size=n)
    a = eval_stats.paired_bootstrap(series, resamples=1000, seed=7)
    b = eval_stats.paired_bootstrap(series, resamples=1000, seed=7)
    assert a == b
    for name in eval_stats.STATISTICS:
        fig = a[name]
        assert fig["lo"] <= fig["value"] <= fig["hi"], (name, fig)
    assert a["kld_mean"]["value"] == pytest.approx(series["kld"].mean())
    assert a["top1"]["value"] == pytest.approx(series["top1"].mean())
    # the CI of the mean is about ±1.96 standard errors wide
    se = series["kld"].std() / math.sqrt(n)
    width = a["kld_mean"]["hi"] - a["kld_mean"]["lo"]
    assert 0.7 * 3.92 * se < width < 1.3 * 3.92 * se
    # a shift of the arm's NLL by d nats raises its perplexity by exp(d), in every resample
    shifted = dict(series, nll_arm=series["nll_ref"] + 0.01)
    c = eval_stats.paired_bootstrap(shifted, resamples=300)
    expected = (math.exp(0.01) - 1) * 100
    for key in ("value", "lo", "hi"):
        assert c["ppl_delta_pct"][key] == pytest.approx(expected, rel=1e-9)


def test_series_skip_and_bucket_means() -> None:
    series = eval_stats.PositionSeries(kld=[1.0, 2.0, 3.0, 4.0, 5.0], top1=[True] * 5)
    series.nll_ref = series.nll_arm = [0.0] * 5
    assert series.arrays(skip=2)["kld"].tolist() == [3.0, 4.0, 5.0]
    curve = eval_stats.bucket_means(series.kld, 0, 2)
    assert curve == {"position": [0.5, 2.5, 4.0], "mean": [1.5, 3.5, 5.0]}


# ---- arms and parts ------------------------------------------------------------------------


def test_parse_arms_with_overrides_and_per_arm_settings() -> None:
    arms = parse_arms(
        "fp16, turbo,turbo:window=0:sinks=4,kivi2:k=4", {"window": 64, "k_bits": None}
    )
    assert [a.label for a in arms] == [
        "fp16",
        "turbo:window=64",
        "turbo:window=0:sink_tokens=4",
        "kivi2:window=64:k_bits=4",
    ]
    assert arms[0].kv == {"preset": "fp16"}  # overrides never touch the reference
    assert arms[2].kv == {"preset": "turbo", "window": 0, "sink_tokens": 4}
    assert arms[3].kv == {"preset": "kivi2", "window": 64, "k_bits": 4.0}
    assert parse_arms(arms[2].label)[0] == arms[2]  # a label parses back to the arm


@pytest.mark.parametrize(
    "spec, fragment",
    [
        ("turbo,q4_0", "unknown KV preset"),
        ("turbo:window", "bad value for window"),
        ("turbo:colour=1", "bad KV setting"),
        ("turbo:window=x", "bad value for window"),
        ("turbo,turbo", "listed twice"),
        (" , ", "no KV preset"),
    ],
)
def test_parse_arms_rejects_bad_specs(spec: str, fragment: str) -> None:
    with pytest.raises(InvalidInputError, match=fragment):
        parse_arms(spec)


def test_select_parts() -> None:
    assert select_parts(None, kld=True, greedy=True, retrieval=False) == ("kld", "greedy")
    assert select_parts("passkey,kld", kld=True, greedy=True, retrieval=True) == (
        "passkey",
        "kld",
    )
    with pytest.raises(InvalidInputError):
        select_parts("kld,speed", kld=True, greedy=True, retrieval=True)


# ---- passkey prompts -----------------------------------------------------------------------


def test_needle_and_answer_check() -> None:
    text = "One sentence. Two sentences. Three sentences.\nA new line."
    with_needle = passkey.insert_needle(text, "NEEDLE.", 0.2)
    assert with_needle == "One sentence. NEEDLE. Two sentences. Three sentences.\nA new line."
    assert passkey.insert_needle(text, "N.", 1.0).endswith("line. N.")
    assert passkey.found("12345", "The pass key is 12345.")
    assert passkey.found("12345", "It is 12,345")
    assert not passkey.found("12345", "The pass key is 1234.")
    assert passkey.pass_key(1000, 1) == passkey.pass_key(1000, 1)
    assert len(passkey.pass_key(7000, 3)) == 5


def test_haystack_is_real_text_without_duplicates() -> None:
    hay = passkey.haystack_text()
    assert "GNU GENERAL PUBLIC LICENSE" in hay
    assert hay.count("Version 3, 29 June 2007") <= 2  # GPL and GPL-3 are one file


# ---- model-level, on the tiny random model ---------------------------------------------------


@pytest.fixture(scope="module")
def tiny_loaded(tiny_model_dir: Path, native: ModuleType) -> Any:
    import spinkv.api as api

    return api.load(str(tiny_model_dir))


def test_passkey_prompt_length_is_near_the_depth(tiny_loaded: Any) -> None:
    settings = ev.EvalSettings(arms=[], passkey_depths=(300, 450, 5000))
    assert tiny_loaded.has_own_chat_template
    prompts, skipped = ev.passkey_prompts(tiny_loaded, settings)
    assert skipped == [5000]  # beyond the tiny model's 512-token context
    for prompt in prompts:
        assert abs(len(prompt.token_ids) - prompt.depth) <= 0.15 * prompt.depth
        text = tiny_loaded.detokenize(prompt.token_ids)
        assert passkey.NEEDLE.format(key=prompt.key) in text
        assert text.rstrip().endswith(passkey.QUESTION) or passkey.QUESTION in text


def test_a_base_model_gets_raw_prompts_ending_in_the_answer(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """A model without a chat template of its own is asked in plain text (not the ChatML
    fallback), and its passkey prompt ends in the answer's first words."""
    import shutil

    import spinkv.api as api

    base_dir = tmp_path / "base"
    shutil.copytree(tiny_model_dir, base_dir)
    config_path = base_dir / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config.pop("chat_template", None)
    config_path.write_text(json.dumps(config))
    (base_dir / "chat_template.jinja").unlink(missing_ok=True)
    base = api.load(str(base_dir))
    assert not base.has_own_chat_template
    assert ev.question_ids(base)("Water boils at") == base.tokenize(
        "Water boils at", add_special_tokens=True
    )
    settings = ev.EvalSettings(arms=[], passkey_depths=(300,))
    (prompt,), _ = ev.passkey_prompts(base, settings)
    text = base.detokenize(prompt.token_ids)
    assert "<|im_start|>" not in text
    assert text.rstrip().endswith(f"{passkey.QUESTION}\n{passkey.ANSWER_PRIMER}")
    assert abs(len(prompt.token_ids) - prompt.depth) <= 0.15 * prompt.depth


def test_fp16_decode_path_equals_batched_prefill(tiny_loaded: Any) -> None:
    """The reference (batched prefill, all logits) and the decode path agree for fp16."""
    ids = ev.text_token_ids(tiny_loaded, ev.DEFAULT_TEXT, 300)
    batched = tiny_loaded.session("fp16").prefill(ids, True)
    stepped = tiny_loaded.session("fp16")
    rows = []
    for pos, token in enumerate(ids):
        if pos == 0:
            stepped.prefill([token])
        else:
            stepped.decode(token)
        rows.append(np.array(stepped.logits()))
    np.testing.assert_allclose(np.stack(rows), batched, rtol=1e-3, atol=1e-3)  # f32 sum order
    series, _ = ev.teacher_forced(tiny_loaded, ids, parse_arms("fp16"))
    arrays = series["fp16"].arrays()
    assert len(arrays["kld"]) == len(ids) - 1
    assert arrays["kld"].max() < 1e-6
    assert arrays["top1"].all()


def test_a_compressed_cache_diverges_from_fp16(tiny_loaded: Any) -> None:
    ids = ev.text_token_ids(tiny_loaded, ev.DEFAULT_TEXT, 200)
    arms = parse_arms("turbo:window=0,kivi2:window=0")
    series, stats = ev.teacher_forced(tiny_loaded, ids, arms)
    for arm in arms:
        kld = series[arm.label].arrays(skip=64)["kld"]
        assert kld.mean() > 1e-5
        assert stats[arm.label]["total"]["compressed_tokens"] > 0


REQUIRED_ARM_KEYS = {
    "label",
    "kv",
    "kld_mean",
    "kld_p99",
    "top1",
    "ppl",
    "ppl_ref",
    "ppl_delta_pct",
    "cache",
    "depth_curve",
}


def check_record(record: dict[str, Any], labels: list[str]) -> None:
    assert record["schema"] == ev.SCHEMA
    assert set(record) >= {"model", "machine", "settings", "kld", "greedy", "passkey", "seconds"}
    assert [a["label"] for a in record["settings"]["arms"]] == labels
    kld = record["kld"]
    assert kld["positions"] == kld["tokens"] - 1 - kld["skip"]
    assert set(kld["reference"]["ppl"]) == {"value", "lo", "hi"}
    for arm in kld["arms"]:
        assert set(arm) >= REQUIRED_ARM_KEYS
        for name in eval_stats.STATISTICS:
            fig = arm[name]
            assert all(math.isfinite(fig[k]) for k in ("value", "lo", "hi"))
            assert fig["lo"] <= fig["value"] <= fig["hi"] or math.isclose(fig["lo"], fig["hi"])
        curve = arm["depth_curve"]
        assert len(curve["position"]) == len(curve["kld_mean"]) == len(curve["top1"])
    greedy = record["greedy"]
    assert [a["label"] for a in greedy["arms"]] == labels
    for arm in greedy["arms"]:
        assert 0 <= arm["mean_agree_tokens"] <= greedy["gen_tokens"]
        assert 0 <= arm["identical"] <= arm["prompts"] == len(greedy["prompts"])
    pk = record["passkey"]
    assert pk["labels"][0] == "fp16"
    for row in pk["depths"]:
        assert set(row["results"]) == set(pk["labels"])
        assert all(isinstance(r["found"], bool) for r in row["results"].values())


def test_evaluate_record_schema(tiny_loaded: Any) -> None:
    settings = ev.EvalSettings(
        arms=parse_arms("turbo:window=32,kivi4"),
        n_tokens=120,
        skip=16,
        gen_tokens=6,
        prompts=ev.GREEDY_PROMPTS[:3],
        passkey_depths=(400,),
        resamples=100,
        bucket=16,
    )
    record = ev.evaluate(tiny_loaded, settings)
    check_record(json.loads(json.dumps(record)), ["turbo:window=32", "kivi4"])
    assert record["settings"]["n_tokens"] == 120
    assert record["kld"]["tokens"] == 120 and record["kld"]["bos"]


def test_cli_eval_json_and_tables(
    tiny_model_dir: Path, native: ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    base = ["eval", "-m", str(tiny_model_dir), "--tokens", "80", "--skip", "8", "--gen", "4"]
    base += ["--passkey-depths", "400", "--resamples", "50"]
    code = run_cli([*base, "--kv", "turbo", "--kv-window", "0", "--json"])
    out = capsys.readouterr().out
    assert code == 0
    record = json.loads(out)
    check_record(record, ["turbo:window=0"])
    assert record["settings"]["arms"][0]["kv"] == {"preset": "turbo", "window": 0}
    code = run_cli([*base, "--kv", "kivi2", "--only", "kld"])
    out = capsys.readouterr().out
    assert code == 0
    assert "teacher-forced vs fp16" in out and "kivi2" in out
    assert "greedy agreement" not in out and "passkey" not in out


def test_cli_eval_bad_input_is_one_line(
    tiny_model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run_cli(["eval", "-m", str(tiny_model_dir), "--kv", "turbo,bogus"]) == 2
    assert 'unknown KV preset "bogus"' in capsys.readouterr().err
    assert run_cli(["eval", "-m", str(tiny_model_dir), "--text", "/nonexistent"]) == 2
    assert "no such text file" in capsys.readouterr().err


def test_plot_writes_a_png(tiny_loaded: Any, tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    from spinkv.eval.plot import plot_depth

    settings = ev.EvalSettings(
        arms=parse_arms("turbo:window=0"), n_tokens=100, skip=8, parts=("kld",), resamples=10
    )
    out = plot_depth(ev.evaluate(tiny_loaded, settings), tmp_path / "depth.png")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_paths_are_checked_before_the_run(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    from spinkv.errors import InvalidInputError
    from spinkv.eval.plot import plot_path

    assert plot_path(tmp_path / "depth") == tmp_path / "depth.png"
    assert plot_path(tmp_path / "depth.svg") == tmp_path / "depth.svg"
    with pytest.raises(InvalidInputError, match="cannot write .xyz files"):
        plot_path(tmp_path / "depth.xyz")


def test_passkey_depths_all_beyond_the_context_are_an_error(
    tiny_model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["eval", "-m", str(tiny_model_dir), "--only", "passkey", "--passkey-depths", "99999"]
    assert run_cli(args) == 2
    assert "beyond the context" in capsys.readouterr().err
