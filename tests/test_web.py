"""`spinkv web` end to end: the server's contract (COOP/COEP, ranges, errors) and the chat page
in headless Chromium giving the native reply token for token, saving a session in the
browser, reloading and resuming it. Screenshots go to $SPINKV_TEST_ARTIFACTS (or the test's
tmp dir).

The browser test skips with one line without chromium, node or a wasm toolchain;
SPINKV_REQUIRE_CROSS=1 (CI) turns that into a failure."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

QUESTION = "What is the capital of France?"
FOLLOW_UP = "And of Germany?"
CHROMIUM = os.environ.get("SPINKV_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"


def _require(reason: str) -> None:
    if os.environ.get("SPINKV_REQUIRE_CROSS") == "1":
        pytest.fail(f"SPINKV_REQUIRE_CROSS=1 but {reason}")
    pytest.skip(reason)


def _spinkv(*args: str) -> list[str]:
    return [sys.executable, "-m", "spinkv", *args]


@pytest.fixture(scope="module")
def server(default_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """`spinkv web --port 0` on the default model; yields its URL."""
    if os.environ.get("SPINKV_SKIP_CROSS") == "1":
        pytest.skip("SPINKV_SKIP_CROSS=1")
    from spinkv.web.bundle import BundleError, build_bundle, find_toolchain

    try:
        find_toolchain()
    except BundleError as exc:
        _require(f"the wasm bundle cannot be built here: {exc}")
    build_bundle(print)  # up front, so the server starts at once
    log = tmp_path_factory.mktemp("web") / "stderr.txt"
    with log.open("w") as err:
        process = subprocess.Popen(
            _spinkv("web", "--port", "0"), stdout=subprocess.PIPE, stderr=err, text=True
        )
    assert process.stdout is not None
    url = process.stdout.readline().strip()
    try:
        assert url.startswith("http://127.0.0.1:"), (url, log.read_text()[-2000:])
        yield url
    finally:
        process.terminate()
        process.wait(timeout=30)


def _get(url: str, headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as error:
        return error.code, dict(error.headers), error.read()


def test_server_headers_ranges_and_errors(server: str, default_model_dir: Path) -> None:
    status, headers, body = _get(server)
    assert status == 200 and b"spinkv" in body
    assert headers["Cross-Origin-Opener-Policy"] == "same-origin"
    assert headers["Cross-Origin-Embedder-Policy"] == "require-corp"
    status, headers, body = _get(server + "spinkv_wasm.wasm")
    assert status == 200 and headers["Content-Type"] == "application/wasm"
    assert body[:4] == b"\0asm"
    manifest = json.loads(_get(server + "api/manifest")[2])
    names = [f["name"] for f in manifest["files"]]
    assert "model.safetensors" in names and "config.json" in names
    weights = default_model_dir / "model.safetensors"
    status, headers, body = _get(server + "model/model.safetensors", {"Range": "bytes=8-23"})
    assert status == 206 and headers["Content-Range"] == f"bytes 8-23/{weights.stat().st_size}"
    with weights.open("rb") as f:
        f.seek(8)
        assert body == f.read(16)
    status, headers, _ = _get(server + "model/model.safetensors", {"Range": "bytes=-4"})
    assert status == 206 and headers["Content-Length"] == "4"
    status, _, _ = _get(
        server + "model/model.safetensors", {"Range": f"bytes={weights.stat().st_size}-"}
    )
    assert status == 416
    etag = _get(server + "model/config.json")[1]["ETag"]
    assert _get(server + "model/config.json", {"If-None-Match": etag})[0] == 304
    # Only the model's own files are served, nothing else from the disk.
    assert _get(server + "model/..%2Fconfig.json")[0] == 404
    assert _get(server + "model/spinkv.json")[0] == 404
    assert _get(server + "static/../command.py")[0] == 404
    # Uploads must be intact session files under a valid name.
    bad = urllib.request.Request(server + "api/sessions/x", data=b"not a session", method="PUT")
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(bad, timeout=30)
    assert info.value.code == 400 and "session" in json.loads(info.value.read())["error"]


def test_missing_model_is_one_line(tmp_path: Path) -> None:
    done = subprocess.run(
        _spinkv("web", "--port", "0", "--model", str(tmp_path / "nothing-here")),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("error:"), done.stderr


def test_busy_port_is_one_line(server: str) -> None:
    port = server.rstrip("/").rsplit(":", 1)[1]
    started = time.monotonic()
    done = subprocess.run(
        _spinkv("web", "--port", port), capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 2, done.stderr
    error_lines = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(error_lines) == 1 and f"port {port}" in error_lines[0], done.stderr
    assert "Traceback" not in done.stderr
    assert time.monotonic() - started < 600


def _artifacts(tmp_path: Path) -> Path:
    out = Path(os.environ.get("SPINKV_TEST_ARTIFACTS") or tmp_path / "artifacts")
    out.mkdir(parents=True, exist_ok=True)
    return out


def test_chat_page_in_chromium_matches_native(
    server: str, default_model_dir: Path, tmp_path: Path
) -> None:
    import spinkv
    from spinkv.web.bundle import source_root

    if not Path(CHROMIUM).is_file():
        _require("chromium is not installed (apt-get install chromium)")
    node = shutil.which("node")
    if node is None:
        _require("node is not installed (apt-get install nodejs)")
    assert node is not None
    out = _artifacts(tmp_path)
    script = source_root() / "cli" / "spinkv" / "web" / "e2e.mjs"
    done = subprocess.run(
        [node, "--experimental-websocket", str(script), CHROMIUM, server, str(out)]
        + [QUESTION, FOLLOW_UP],
        capture_output=True,
        text=True,
        timeout=1500,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    assert lines, (done.stdout[-2000:], done.stderr[-2000:])
    result: dict[str, Any] = json.loads(lines[-1])
    assert "error" not in result, result
    (out / "e2e.json").write_text(json.dumps(result, indent=2))

    loaded = spinkv.load(default_model_dir)
    chat = loaded.chat()
    first = chat.ask(QUESTION)
    second = chat.ask(FOLLOW_UP)
    assert result["first"]["text"] == first.text == "The capital of France is Paris."
    assert result["first"]["token_ids"] == first.token_ids
    # Saved in OPFS, the page reloaded, the session restored with its KV cache...
    assert result["saved"]["tokens"] > 0
    assert result["restored"]["reused"] is True, result["restored"]
    assert result["restored"]["messages"] == 2
    # ...so the follow-up only prefilled the new turn and continued token for token.
    assert result["second"]["cached_tokens"] > 0
    assert result["second"]["token_ids"] == second.token_ids, (result["second"], second.text)
    # The page's chat slides as the terminal's does; this short one never had to.
    session = result["stats"]["session"]
    assert session["sliding"] is True and session["retired_tokens"] == 0, session
    assert session["context_start"] == 0, session
    memory = result["stats"]["memory"]
    assert memory["peak_pages"] >= memory["pages"] > 0
    for shot in result["screenshots"]:
        assert Path(shot).stat().st_size > 10_000  # a real page, not a blank frame
