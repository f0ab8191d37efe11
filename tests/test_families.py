"""Every model family against transformers: tiny random-weight models written by transformers
itself (models/families.py, committed under tests/fixtures/families with transformers' logits),
run by spinkv with f32 weights, prefill and one token at a time, through every KV preset (the
sequences are shorter than any preset's fp16 window, so each runs its fp16 path)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from helpers import assert_one_line_error, spinkv_cli
from spinkv import api
from spinkv.errors import SpinkvError

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "families"
FAMILIES = sorted(p.name for p in FIXTURES.iterdir() if (p / "reference.npz").is_file())
PRESETS = ["fp16", "turbo", "turbo-qjl", "kivi2", "kivi4"]
# Against transformers with K and V rounded to fp16 in attention, as spinkv's cache stores them
# (`*_fp16_kv`): what is left is summation order and f32 rounding.
MAX_LOGIT_DIFF = 1e-3
# Against transformers in f32 end to end: the fp16 storage of K/V itself moves these random
# models' logits by up to ~8e-3 (models/families.py prints it per family).
MAX_LOGIT_DIFF_F32_KV = 1e-2


def test_every_family_has_a_fixture() -> None:
    assert FAMILIES == ["gemma3", "llama-bias", "llama3", "mistral", "qwen2", "qwen3"]


@pytest.fixture(scope="module", params=FAMILIES)
def family(request: pytest.FixtureRequest) -> tuple[str, api.LoadedModel, dict[str, np.ndarray]]:
    path = FIXTURES / request.param
    with np.load(path / "reference.npz") as data:
        reference = {key: data[key] for key in data.files}
    return request.param, api.load(path), reference


@pytest.mark.parametrize("preset", PRESETS)
def test_prefill_matches_transformers(
    family: tuple[str, api.LoadedModel, dict[str, np.ndarray]], preset: str
) -> None:
    name, model, reference = family
    tokens = reference["tokens"].tolist()
    logits = model.logits(tokens, kv=preset)
    diff = float(np.abs(logits - reference["prefill_fp16_kv"]).max())
    assert diff <= MAX_LOGIT_DIFF, f"{name} {preset}: max |Δlogit| {diff:.2e}"
    diff_f32 = float(np.abs(logits - reference["prefill"]).max())
    assert diff_f32 <= MAX_LOGIT_DIFF_F32_KV, f"{name} {preset}: vs f32 KV {diff_f32:.2e}"
    # The logits are far from flat, so the comparison means something.
    assert reference["prefill"].std() > 1.0


def test_decode_matches_transformers(
    family: tuple[str, api.LoadedModel, dict[str, np.ndarray]],
) -> None:
    name, model, reference = family
    session = model.session("fp16")
    steps = []
    for token in reference["tokens"].tolist():
        session.decode(token)
        steps.append(np.asarray(session.logits()))
    diff = float(np.abs(np.stack(steps) - reference["decode_fp16_kv"]).max())
    assert diff <= MAX_LOGIT_DIFF, f"{name} step-by-step: max |Δlogit| {diff:.2e}"
    diff_f32 = float(np.abs(np.stack(steps) - reference["decode"]).max())
    assert diff_f32 <= MAX_LOGIT_DIFF_F32_KV, f"{name} step-by-step vs f32 KV {diff_f32:.2e}"


def test_tokenizer_matches_fixture(
    family: tuple[str, api.LoadedModel, dict[str, np.ndarray]],
) -> None:
    _, model, reference = family
    text = model.detokenize(reference["tokens"].tolist())
    assert model.tokenize(text) == reference["tokens"].tolist()


def test_mistral_window_matters() -> None:
    """The window is shorter than the sequence: attending to everything would differ."""
    config = json.loads((FIXTURES / "mistral" / "config.json").read_text())
    with np.load(FIXTURES / "mistral" / "reference.npz") as data:
        assert len(data["tokens"]) > 3 * config["sliding_window"]


def test_unknown_architecture_is_one_line(tmp_path: Path) -> None:
    model_dir = tmp_path / "phi"
    shutil.copytree(FIXTURES / "qwen2", model_dir)
    config_path = model_dir / "config.json"
    config = json.loads(config_path.read_text())
    config["architectures"] = ["PhiForCausalLM"]
    config_path.write_text(json.dumps(config))
    with pytest.raises(SpinkvError) as caught:
        api.load(model_dir)
    message = str(caught.value)
    assert "PhiForCausalLM" in message and "\n" not in message


def test_run_hf_repo_id_through_the_hf_cache(tmp_path: Path) -> None:
    """`spinkv run -m Qwen/Qwen2.5-0.5B-Instruct` goes through huggingface_hub's snapshot of
    the repo: here an offline HF cache holding the tiny Qwen2 fixture under that repo id (no
    hub on this machine; with one, snapshot_download fetches the real files the same way)."""
    repo = tmp_path / "hf" / "hub" / "models--Qwen--Qwen2.5-0.5B-Instruct"
    sha = "7ae557604adf67be50417f59c2c2f167def9a775"
    shutil.copytree(FIXTURES / "qwen2", repo / "snapshots" / sha)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(sha)
    env = {
        "HF_HUB_OFFLINE": "1",
        "HF_HOME": str(tmp_path / "hf"),
        "SPINKV_HOME": str(tmp_path / "home"),
    }
    done = spinkv_cli(
        "run",
        "The capital of France",
        "-m",
        "Qwen/Qwen2.5-0.5B-Instruct",
        "-n",
        "4",
        "--json",
        **env,
    )
    assert done.returncode == 0, done.stderr
    record = json.loads(done.stdout)
    assert record["completion_tokens"] >= 1
    missing = spinkv_cli("run", "hi", "-m", "Qwen/Qwen3-0.6B", "-n", "4", **env)
    assert_one_line_error(missing, "Qwen/Qwen3-0.6B", "not in the local HF cache")


def test_unknown_architecture_from_the_cli(tmp_path: Path) -> None:
    model_dir = tmp_path / "gpt2"
    shutil.copytree(FIXTURES / "llama3", model_dir)
    config_path = model_dir / "config.json"
    config = json.loads(config_path.read_text())
    config["architectures"] = ["GPT2LMHeadModel"]
    config_path.write_text(json.dumps(config))
    done = spinkv_cli("run", "hi", "-m", str(model_dir), "-n", "4")
    assert_one_line_error(done, "GPT2LMHeadModel")


def _write_gemma3_gguf(model_dir: Path, out: Path) -> None:
    """The Gemma 3 fixture as llama.cpp's converter writes Gemma 3: arch gemma3, norm gains
    stored as 1 + w, no Q/K row permutation, f32 tensors."""
    import gguf
    from safetensors.numpy import load_file
    from spinkv.models.gguf_export import _add_hyper, _add_tokenizer
    from spinkv.models.tensor_names import hf_to_gguf

    config = json.loads((model_dir / "config.json").read_text())
    writer = gguf.GGUFWriter(str(out), "gemma3")
    _add_hyper(writer, config)
    writer.add_sliding_window(int(config["sliding_window"]))
    _add_tokenizer(writer, model_dir, config)
    names = hf_to_gguf(int(config["num_hidden_layers"]), "gemma3")
    for name, array in load_file(str(model_dir / "model.safetensors")).items():
        shift = 1.0 if name.endswith("norm.weight") else 0.0
        writer.add_tensor(names[name], np.ascontiguousarray(array + np.float32(shift)))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def test_gemma3_gguf_import_undoes_llama_cpp_conventions(tmp_path: Path) -> None:
    """A Gemma 3 GGUF imports to the HF tensors it came from (norm shift removed, Q/K rows as
    they were) and to llama.cpp's Gemma 3 layer rules (every 6th layer global, local RoPE
    base 10,000, query scale 1/sqrt(head_dim))."""
    from safetensors.numpy import load_file
    from spinkv.models.gguf_import import import_gguf

    source = FIXTURES / "gemma3"
    gguf_path = tmp_path / "tiny-gemma3.gguf"
    _write_gemma3_gguf(source, gguf_path)
    imported = import_gguf(gguf_path, dtype="f32", out_dir=tmp_path / "imported")
    original = load_file(str(source / "model.safetensors"))
    converted = load_file(str(imported / "model.safetensors"))
    assert sorted(converted) == sorted(original)
    for name, array in original.items():
        np.testing.assert_allclose(converted[name], array, rtol=0, atol=1e-6, err_msg=name)
    config = json.loads((imported / "config.json").read_text())
    assert config["architectures"] == ["Gemma3ForCausalLM"]
    assert config["layer_types"] == ["sliding_attention"] * 4  # layer 6 would be global
    assert config["query_pre_attn_scalar"] == config["head_dim"] == 32
    assert config["sliding_window"] == 6 and config["rope_local_base_freq"] == 10000.0
    model = api.load(imported)
    assert model.config["family"] == "gemma3"


def test_gemma3_import_exports_the_same_gguf_for_llama_cpp(tmp_path: Path) -> None:
    """An imported Gemma 3 model exports (for `spinkv bench --compare-llama-cpp`) as a GGUF
    with the source's metadata and the imported weights in llama.cpp's conventions; llama.cpp,
    where installed, then gives our logits."""
    import gguf
    from spinkv.models.gguf_export import cached_gguf
    from spinkv.models.gguf_import import METADATA_FILE, import_gguf

    source_path = tmp_path / "tiny-gemma3.gguf"
    _write_gemma3_gguf(FIXTURES / "gemma3", source_path)
    imported = import_gguf(source_path, dtype="f32", out_dir=tmp_path / "imported")
    assert (imported / METADATA_FILE).is_file()
    exported = cached_gguf(imported, tmp_path / "exports")
    source, copy = gguf.GGUFReader(source_path), gguf.GGUFReader(exported)
    changed = {"general.file_type", "GGUF.tensor_count", "GGUF.kv_count"}
    for name, field in source.fields.items():
        if name not in changed:
            assert copy.fields[name].contents() == field.contents(), name
    assert copy.fields["general.file_type"].contents() == gguf.LlamaFileType.MOSTLY_F16
    theirs = {t.name: t for t in copy.tensors}
    assert sorted(theirs) == sorted(t.name for t in source.tensors)
    for tensor in source.tensors:
        got = np.asarray(theirs[tensor.name].data, dtype=np.float32)
        want = np.asarray(tensor.data, dtype=np.float32)
        tolerance = 0 if want.ndim == 1 else 1e-3 * float(np.abs(want).max())  # f32 -> f16
        np.testing.assert_allclose(got, want, rtol=1e-3, atol=tolerance, err_msg=tensor.name)

    llama_cpp = pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed")
    del llama_cpp
    from spinkv.bench.llamacpp import LlamaCppEngine

    tokens = [2, 50, 60, 70, 80, 90, 100, 33, 7, 12]  # longer than the 6-token window
    llama = LlamaCppEngine(exported, n_ctx=64, threads=1)
    try:
        llama.new_context(None)
        llama.prefill(tokens)
        logits = np.ctypeslib.as_array(llama._llm._ctx.get_logits(), shape=(llama._n_vocab,))
        ours = api.load(imported).session("fp16")
        ours.prefill(tokens)
        np.testing.assert_allclose(logits, ours.logits(), atol=0.02)
    finally:
        llama.close()
