"""Saved conversations: ``<store>/sessions/NAME.spkv``.

A session file (format in docs/SESSIONS.md) holds the cache identity record, the transcript
(this module's JSON: messages, system prompt, sampler settings, model and cache options) and
the KV pages as they are. Files are replaced atomically (temp file + ``os.replace``) under an
``flock`` on ``.NAME.spkv.lock``, so two processes saving one session never corrupt it: a
reader sees the old file or the new one. Restoring takes the same lock (shared), so the
transcript and the pages it reads belong together. A chat bound to a session holds a lease on
it (``.NAME.spkv.owner``) for its whole life, so a second chat on the same session is refused
instead of silently dropping the first one's turns. A file is only replaced by one of its own
kind (chat session or prompt cache), and never when it cannot be read; only regular files are
opened (a FIFO would block).

The identity inputs computed here: the tokenizer hash (tokenizer.json and the special-token
ids) and the chat-template hash (template source and its bos/eos strings). The runtime adds
the model's content hash, cache layout, codec policy and build.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from spinkv.errors import (
    InvalidInputError,
    SessionFileError,
    SessionPagesError,
    SpinkvError,
    one_line,
)
from spinkv.kv.options import DEFAULT_KV_PRESET
from spinkv.tokenizer import valid_text
from spinkv.util.files import (
    Lease,
    locked,
    replace_with,
    require_regular_file,
    write_atomic,
)
from spinkv.util.names import check_name as check_store_name

if TYPE_CHECKING:
    from spinkv.api import ChatSession
    from spinkv.chat_template import ChatTemplate
    from spinkv.tokenizer import Tokenizer

SUFFIX = ".spkv"
TRANSCRIPT_FORMAT = "spinkv-transcript"
TRANSCRIPT_VERSION = 1

ExportFormat = Literal["markdown", "json"]


class SessionNotFoundError(SpinkvError):
    """No session of that name in the store."""


class TranscriptError(SpinkvError):
    """A session file whose checksums hold but whose transcript is not spinkv's JSON."""


# ---- identity inputs ------------------------------------------------------------------------


def tokenizer_hash(model_dir: Path, tokenizer: Tokenizer) -> str:
    """sha256 (hex) of tokenizer.json and the special-token ids the runtime stops on."""
    digest = hashlib.sha256(b"spinkv tokenizer v1\0")
    path = Path(model_dir) / "tokenizer.json"
    digest.update(path.read_bytes() if path.is_file() else b"")
    specials = {"bos": tokenizer.bos_token_id, "eos": sorted(tokenizer.eos_token_ids)}
    digest.update(json.dumps(specials, sort_keys=True).encode())
    return digest.hexdigest()


def chat_template_hash(template: ChatTemplate | None) -> str:
    """sha256 (hex) of the chat template source and the bos/eos strings it renders."""
    digest = hashlib.sha256(b"spinkv chat template v1\0")
    if template is not None:
        record = {"source": template.source, "bos": template.bos_token, "eos": template.eos_token}
        digest.update(json.dumps(record, sort_keys=True).encode())
    return digest.hexdigest()


# ---- transcript -------------------------------------------------------------------------------


def now_iso() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


@dataclass
class Transcript:
    """What a session file says about its conversation (the JSON between identity and pages).

    messages always hold the whole conversation; context_start is the index of the first one
    the saved cache was fed (beyond 0 when a sliding chat rebuilt its cache from the newest
    turns of a conversation longer than its context: see ChatSession). Written only when
    beyond 0, so other files are as before.
    """

    messages: list[dict[str, str]]
    system: str | None = None
    kind: str = "chat"
    model: dict[str, Any] = field(default_factory=dict)
    kv: dict[str, Any] | None = None
    sampling: dict[str, Any] = field(default_factory=dict)
    max_tokens: int | None = None
    created: str = field(default_factory=now_iso)
    updated: str = field(default_factory=now_iso)
    context_start: int = 0

    @property
    def turns(self) -> int:
        return sum(1 for m in self.messages if m["role"] == "user")

    @property
    def preset(self) -> str:
        return str((self.kv or {}).get("preset") or DEFAULT_KV_PRESET)

    def to_json(self) -> str:
        record = {
            "format": TRANSCRIPT_FORMAT,
            "version": TRANSCRIPT_VERSION,
            "kind": self.kind,
            "model": self.model,
            "kv": self.kv,
            "system": self.system,
            "messages": self.messages,
            "sampling": self.sampling,
            "max_tokens": self.max_tokens,
            "created": self.created,
            "updated": self.updated,
        }
        if self.context_start:
            record["context_start"] = self.context_start
        return json.dumps(_utf8_clean(record), ensure_ascii=False)

    @classmethod
    def from_json(cls, text: str, origin: str = "session") -> Transcript:
        def bad(why: str) -> TranscriptError:
            return TranscriptError(f"{origin}: transcript is not spinkv's: {why}")

        try:
            record = json.loads(text)
        except ValueError as exc:
            raise bad(f"invalid JSON ({exc})") from exc
        except RecursionError:
            raise bad("JSON nested too deeply") from None
        if not isinstance(record, dict) or record.get("format") != TRANSCRIPT_FORMAT:
            raise bad("no spinkv-transcript format tag")
        if record.get("version") != TRANSCRIPT_VERSION:
            raise bad(f"version {record.get('version')!r} (this spinkv reads 1)")
        messages = record.get("messages")
        if not isinstance(messages, list) or not all(
            isinstance(m, dict)
            and isinstance(m.get("role"), str)
            and isinstance(m.get("content"), str)
            for m in messages
        ):
            raise bad("messages must be a list of {role, content} strings")
        system = record.get("system")
        if system is not None and not isinstance(system, str):
            raise bad("system must be a string")

        def mapping(key: str) -> dict[str, Any]:
            value = record.get(key)
            return dict(value) if isinstance(value, Mapping) else {}

        kv = record.get("kv")
        max_tokens = record.get("max_tokens")
        start = record.get("context_start")
        if isinstance(start, bool) or not isinstance(start, int) or not 0 <= start <= len(messages):
            start = 0  # only a hint of where the cache starts: the conversation stays readable
        return cls(
            messages=[
                {"role": valid_text(m["role"]), "content": valid_text(m["content"])}
                for m in messages
            ],
            system=None if system is None else valid_text(system),
            kind=str(record.get("kind") or "chat"),
            model=mapping("model"),
            kv=dict(kv) if isinstance(kv, Mapping) else None,
            sampling=mapping("sampling"),
            max_tokens=max_tokens if isinstance(max_tokens, int) else None,
            created=str(record.get("created") or ""),
            updated=str(record.get("updated") or ""),
            context_start=start,
        )


def _utf8_clean(value: Any) -> Any:
    """value with every string made encodable as UTF-8 (a lone surrogate, from bytes that were
    not UTF-8 in an argument or a file, becomes U+FFFD): a save must never fail on its text."""
    if isinstance(value, str):
        return valid_text(value)
    if isinstance(value, Mapping):
        return {_utf8_clean(k): _utf8_clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_utf8_clean(v) for v in value]
    return value


def read_transcript(path: Path) -> tuple[Transcript, dict[str, Any]]:
    """(transcript, header) of a session file; the header comes from the runtime
    (`read_session`: identity, sizes). Raises the runtime's SessionFileError if unreadable."""
    from spinkv import _native

    require_regular_file(Path(path), "session file")
    header = dict(_native.read_session(str(path)))
    return Transcript.from_json(header["transcript"], origin=f"session file {path}"), header


# ---- the store --------------------------------------------------------------------------------


def sessions_dir() -> Path:
    from spinkv.models.store import store_dir

    return store_dir() / "sessions"


def check_name(name: str) -> str:
    check_store_name(name, "session")
    if name.endswith(SUFFIX):
        raise InvalidInputError(f"invalid session name {name!r}: leave out the {SUFFIX} suffix")
    return name


def session_path(name: str) -> Path:
    return sessions_dir() / f"{check_name(name)}{SUFFIX}"


def existing_session(name: str) -> Path:
    path = session_path(name)
    if not path.exists() and not path.is_symlink():
        known = ", ".join(s.name for s in list_sessions()) or "none saved yet"
        raise SessionNotFoundError(f"no session named {name!r} ({known})")
    return path


@dataclass
class SessionInfo:
    """One row of `spinkv sessions list`."""

    name: str
    path: Path
    size: int
    model: str = "-"
    preset: str = "-"
    turns: int = 0
    tokens: int = 0
    updated: str = "-"
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "model": self.model,
            "preset": self.preset,
            "turns": self.turns,
            "tokens": self.tokens,
            "size_bytes": self.size,
            "last_used": self.updated,
            "path": str(self.path),
            "error": self.error,
        }


def session_info(path: Path) -> SessionInfo:
    """The listing row of one file; unreadable files get `error` instead of failing."""
    from spinkv import _native

    name = path.name[: -len(SUFFIX)] if path.name.endswith(SUFFIX) else path.name
    size = path.stat().st_size if path.is_file() else 0
    try:
        transcript, header = read_transcript(path)
    except (_native.SpinkvError, SpinkvError, OSError, RecursionError, MemoryError) as exc:
        return SessionInfo(name, path, size, error=one_line(exc))
    return SessionInfo(
        name=name,
        path=path,
        size=size,
        model=str(transcript.model.get("name") or "-"),
        preset=transcript.preset,
        turns=transcript.turns,
        tokens=int(header["tokens"]),
        updated=transcript.updated or "-",
    )


def list_sessions() -> list[SessionInfo]:
    root = sessions_dir()
    if not root.is_dir():
        return []
    paths = sorted(p for p in root.iterdir() if p.name.endswith(SUFFIX))
    return [session_info(p) for p in paths]


def show_session(name: str) -> dict[str, Any]:
    """Everything about one session: listing row, identity record, whole-file integrity.
    Raises the runtime's SessionFileError (unreadable) or SessionPagesError-style SpinkvError
    when the pages are damaged (the transcript is intact: export still works)."""
    from spinkv import _native

    path = existing_session(name)
    transcript, header = read_transcript(path)
    verified = dict(_native.read_session(str(path), verify=True))
    if not verified.get("intact", False):
        raise SessionPagesError(
            f"session file {path} has damaged KV pages (checksum mismatch); its transcript is "
            f"intact: `spinkv sessions export {name}` recovers it and `spinkv chat --session "
            f"{name}` re-prefills it"
        )
    info = session_info(path)
    return {
        **info.to_dict(),
        "created": transcript.created,
        "system": transcript.system,
        "sampling": transcript.sampling,
        "kv": transcript.kv,
        "format_version": header["format_version"],
        "identity": dict(header["identity"]),
    }


def export_transcript(name: str, fmt: ExportFormat = "markdown") -> str:
    """The conversation of a session as Markdown or JSON (the transcript record)."""
    transcript, _ = read_transcript(existing_session(name))
    if fmt == "json":
        record = json.loads(transcript.to_json())
        record["kv"] = record.get("kv") or {"preset": transcript.preset}  # None = the default
        return json.dumps(record, indent=2, ensure_ascii=False) + "\n"
    if fmt != "markdown":
        raise InvalidInputError(f"unknown export format {fmt!r}: markdown or json")
    lines = [f"# {name}", ""]
    facts = [
        f"model: {transcript.model.get('name', '-')}",
        f"KV cache: {transcript.preset}",
        f"turns: {transcript.turns}",
        f"last used: {transcript.updated or '-'}",
    ]
    lines += [f"- {fact}" for fact in facts] + [""]
    if transcript.system is not None:
        lines += ["## System", "", transcript.system, ""]
    for message in transcript.messages:
        lines += [f"## {message['role'].capitalize()}", "", message["content"], ""]
    return "\n".join(lines)


def remove_session(name: str) -> Path:
    """Delete a saved session; refused while a chat in another process has it open."""
    path = existing_session(name)
    with Lease(path, f"session {name}"), locked(path, exclusive=True):
        path.unlink()
    for helper in (f".{path.name}.lock", f".{path.name}.owner"):
        (path.parent / helper).unlink(missing_ok=True)
    return path


def claim_session(name: str) -> Lease:
    """Claim session `name` for this process (a chat that autosaves to it). While held, a
    chat elsewhere cannot bind the same session, so neither can silently drop the other's
    turns; SessionBusyError says which process holds it."""
    return Lease(session_path(name), f"session {name}")


def _refuse_other_kinds(kind: str) -> Callable[[Path], None]:
    """A check_existing for write_atomic: the file being replaced must be a readable session
    file of the same kind (a chat is never overwritten by a prompt cache or the reverse, and
    an unreadable file is never replaced: it may be something else the user named)."""

    def check(path: Path) -> None:
        try:
            transcript, _ = read_transcript(path)
        except (SpinkvError, OSError) as exc:
            raise SessionFileError(
                f"{path} exists and is not a readable spinkv session ({one_line(exc)}); "
                "it was not overwritten"
            ) from None
        if transcript.kind != kind:
            raise InvalidInputError(
                f"{path} holds a {_kind_name(transcript)}, not a {_KIND_NAMES.get(kind, kind)}; "
                "it was not overwritten: choose another file"
            )

    return check


_KIND_NAMES = {"chat": "chat session", "prompt": "prompt cache"}


def _kind_name(transcript: Transcript) -> str:
    name = _KIND_NAMES.get(transcript.kind, f"{transcript.kind!r} file")
    if transcript.kind == "chat":
        name += f" of {transcript.turns} turn{'s' if transcript.turns != 1 else ''}"
    return name


def write_export(path: Path, text: str) -> None:
    """An export written to path atomically. What is there already is checked first: a session
    file (the conversation being exported, say) or anything but a regular file (a directory, a
    FIFO that would block) is refused; an earlier export or other text is replaced."""

    from spinkv import _native

    magic = bytes(_native.SESSION_MAGIC)

    def check(existing: Path) -> None:
        if existing.is_symlink() or not existing.is_file():
            raise InvalidInputError(f"{existing} exists and is not a regular file: not written")
        with existing.open("rb") as file:
            head = file.read(len(magic))
        if head == magic:
            raise InvalidInputError(
                f"{existing} is a spinkv session file: it was not overwritten; choose another file"
            )

    path = Path(path)
    if path.exists() or path.is_symlink():
        check(path)
    # No lock file beside an export (it may go anywhere).
    replace_with(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))


# ---- chats <-> files --------------------------------------------------------------------------


def save_chat(chat: ChatSession, path: Path) -> int:
    """Writes chat (transcript + KV pages) to path atomically; returns the file size."""
    write_atomic(path, chat.save, check_existing=_refuse_other_kinds("chat"))
    return path.stat().st_size


def restore_chat(chat: ChatSession, path: Path, *, system: str | None = None) -> Any:
    """Loads the session file at path into chat under the shared lock (see ChatSession.restore
    for the outcome and `system`)."""
    with locked(path, exclusive=False):
        return chat.restore(path, system=system)


# ---- prompt caches (`spinkv run --prompt-cache FILE`) ---------------------------------------


@dataclass
class PromptCache:
    """A prompt cache file and what became of it in this run.

    status: "new" (no file yet), "hit" (its KV pages were loaded; `reused_tokens` of them
    matched the prompt) or "refused" (identity mismatch or damaged pages: `reason`, `fields`).
    """

    path: Path
    status: str = "new"
    reason: str | None = None
    fields: list[str] = field(default_factory=list)
    reused_tokens: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": str(self.path),
            "status": self.status,
            "reused_tokens": self.reused_tokens,
            "reason": self.reason,
            "fields": self.fields,
        }

    def note(self, prompt_tokens: int) -> str:
        if self.status == "hit":
            return (
                f"prompt cache: reused {self.reused_tokens} of {prompt_tokens} prompt tokens "
                f"from {self.path}"
            )
        if self.status == "refused":
            return f"prompt cache: not reused ({self.reason}); computed all {prompt_tokens} tokens"
        return f"prompt cache: {self.path} created"


def open_prompt_cache(session: Any, identity_extra: Mapping[str, str], path: Path) -> PromptCache:
    """Loads the prompt cache at path into a fresh native session (untouched unless every
    check passed). A missing file is a new cache; an unreadable one raises (the file may be
    something else the user named by mistake: it is never overwritten then)."""
    from spinkv import _native

    cache = PromptCache(Path(path))
    if not cache.path.exists() and not cache.path.is_symlink():
        if not cache.path.parent.is_dir():
            raise InvalidInputError(f"prompt cache directory {cache.path.parent} does not exist")
        return cache
    # Unreadable, or a file of another kind: raises before any lock file is made.
    _refuse_other_kinds("prompt")(cache.path)
    with locked(cache.path, exclusive=False):
        try:
            session.load(str(cache.path), dict(identity_extra))
            cache.status = "hit"
        except _native.IdentityMismatchError as exc:
            cache.status, cache.reason = "refused", str(exc)
            cache.fields = list(getattr(exc, "fields", []))
        except SessionPagesError as exc:
            cache.status, cache.reason = "refused", str(exc)
    return cache


def save_prompt_cache(
    session: Any, identity_extra: Mapping[str, str], path: Path, transcript: Transcript
) -> None:
    """Writes the session (prompt + reply) to path atomically, under the lock."""
    write_atomic(
        Path(path),
        lambda tmp: session.save(str(tmp), transcript.to_json(), dict(identity_extra)),
        check_existing=_refuse_other_kinds("prompt"),
    )
