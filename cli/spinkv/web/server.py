"""The HTTP server behind `spinkv web`: the chat page, the wasm bundle, the model's files from
the store (with range requests and validators, so the browser caches them), and the store's
sessions (list, download, upload) for CLI <-> page exchange.

Every response carries Cross-Origin-Opener-Policy / Cross-Origin-Embedder-Policy, so the page
is cross-origin isolated (a threaded wasm build needs that for SharedArrayBuffer).
"""

from __future__ import annotations

import email.utils
import json
import mimetypes
import re
import threading
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from spinkv.errors import SpinkvError
from spinkv.sessions.store import check_name
from spinkv.util.files import write_atomic

STATIC_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".mjs": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".wasm": "application/wasm",
    ".json": "application/json",
    ".svg": "image/svg+xml",
}
MAX_UPLOAD = 1 << 30
RANGE = re.compile(r"^bytes=(\d*)-(\d*)$")
SOCKET_TIMEOUT_S = 30.0
"""A connection that sends nothing for this long (a body shorter than its Content-Length, a
client gone quiet) is closed: no request holds a server thread forever."""
LOCAL_NAMES = frozenset(["localhost", "127.0.0.1", "::1"])


def host_of(header: str | None) -> str | None:
    """The host name of a Host header (its port and an IPv6 address's brackets removed)."""
    if not header:
        return None
    header = header.strip().lower()
    if header.startswith("["):
        return header[1 : header.find("]")] if "]" in header else None
    return header.rsplit(":", 1)[0] if header.count(":") == 1 else header


class PortInUseError(SpinkvError):
    """The port is taken by another program."""


class WebApp:
    """What the server serves: static files, the bundle, one model, the session store."""

    def __init__(
        self,
        static_dir: Path,
        wasm: Path | None,
        model_dir: Path,
        manifest: dict[str, Any],
        sessions_dir: Path,
    ) -> None:
        self.static_dir = static_dir
        self.wasm = wasm
        self.model_dir = model_dir
        self.manifest = manifest
        self.sessions_dir = sessions_dir
        self.model_files = {f["name"] for f in manifest["files"]}
        # Host names requests may carry: this machine's names when serving this machine only
        # (a page elsewhere that rebinds its own name to 127.0.0.1 is refused), any otherwise.
        self.allowed_hosts: frozenset[str] | None = LOCAL_NAMES

    def serve_host(self, host: str) -> None:
        """Requests are checked against the address the server listens on."""
        self.allowed_hosts = LOCAL_NAMES | {host.lower()} if host.lower() in LOCAL_NAMES else None

    def resolve(self, path: str) -> Path | None:
        """The file behind a GET path, or None."""
        if path in ("/", "/index.html"):
            return self.static_dir / "index.html"
        if path == "/spinkv_wasm.wasm":
            return self.wasm  # None until the bundle is built
        if path.startswith("/static/"):
            name = path[len("/static/") :]
            if "/" in name or name.startswith("."):
                return None
            candidate = self.static_dir / name
            return candidate if candidate.is_file() else None
        if path.startswith("/model/"):
            name = path[len("/model/") :]
            return self.model_dir / name if name in self.model_files else None
        return None

    def session_path(self, name: str) -> Path:
        return self.sessions_dir / f"{check_name(name)}.spkv"

    def list_sessions(self) -> list[dict[str, Any]]:
        if not self.sessions_dir.is_dir():
            return []
        out = []
        for f in sorted(self.sessions_dir.glob("*.spkv")):
            if f.is_file():
                stat = f.stat()
                out.append({"name": f.stem, "bytes": stat.st_size, "modified": stat.st_mtime})
        return out


def _write_checked_session(tmp: Path, body: bytes) -> None:
    """Writes an uploaded session file, refusing bytes that are not an intact one."""
    from spinkv import _native

    tmp.write_bytes(body)
    try:
        header = _native.read_session(str(tmp), True)
    except SpinkvError as exc:  # named after the upload, not the temp file it went to
        raise SpinkvError(str(exc).replace(str(tmp), "the uploaded session file")) from None
    if not header.get("intact", False):
        raise SpinkvError("the uploaded session file is damaged (its checksum does not hold)")


def make_handler(app: WebApp) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = "spinkv-web"
        protocol_version = "HTTP/1.1"
        timeout = SOCKET_TIMEOUT_S

        def _refuse_unread_body(self) -> None:
            """A request whose body this handler does not read ends the connection after the
            answer: left on the socket, the body would be read as the next request."""
            if self.headers.get("Transfer-Encoding") or self.headers.get("Content-Length") not in (
                None,
                "0",
            ):
                self.close_connection = True

        def _host_refused(self) -> bool:
            """Answers 421 for a Host this server does not serve as (see WebApp)."""
            allowed = app.allowed_hosts
            if allowed is None or host_of(self.headers.get("Host")) in allowed:
                return False
            self.close_connection = True
            self._error(HTTPStatus.MISDIRECTED_REQUEST, "this server answers for localhost only")
            return True

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
            pass  # quiet: the terminal shows the address and errors only

        def _common_headers(self) -> None:
            self.send_header("Cross-Origin-Opener-Policy", "same-origin")
            self.send_header("Cross-Origin-Embedder-Policy", "require-corp")
            self.send_header("Cross-Origin-Resource-Policy", "same-origin")
            self.send_header("X-Content-Type-Options", "nosniff")

        def _send_bytes(
            self, status: int, body: bytes, content_type: str, extra: dict[str, str] | None = None
        ) -> None:
            self.send_response(status)
            self._common_headers()
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            for key, value in (extra or {}).items():
                self.send_header(key, value)
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def _json(self, status: int, value: Any) -> None:
            self._send_bytes(status, json.dumps(value).encode(), "application/json")

        def _error(self, status: int, message: str) -> None:
            self._json(status, {"error": message})

        def do_HEAD(self) -> None:  # noqa: N802
            self.do_GET()

        def do_GET(self) -> None:  # noqa: N802
            self._refuse_unread_body()
            if self._host_refused():
                return
            path = self.path.split("?", 1)[0]
            try:
                if path == "/api/manifest":
                    return self._json(200, app.manifest)
                if path == "/api/sessions":
                    return self._json(200, app.list_sessions())
                if path.startswith("/api/sessions/"):
                    file = app.session_path(path[len("/api/sessions/") :])
                    if not file.is_file():
                        return self._error(404, f"no session {file.stem!r} in the store")
                    return self._send_bytes(200, file.read_bytes(), "application/octet-stream")
                file = app.resolve(path)
                if file is None or not file.is_file():
                    return self._error(404, f"not found: {path}")
                self._send_file(file)
            except SpinkvError as exc:
                self._error(400, str(exc))
            except (BrokenPipeError, ConnectionResetError):
                pass

        def do_PUT(self) -> None:  # noqa: N802
            # The body is read only once the request is accepted: every refusal closes.
            self.close_connection = True
            if self._host_refused():
                return
            path = self.path.split("?", 1)[0]
            if not path.startswith("/api/sessions/"):
                return self._error(404, f"not found: {path}")
            if self.headers.get("Transfer-Encoding"):
                return self._error(411, "a session upload needs a Content-Length")
            try:
                file = app.session_path(path[len("/api/sessions/") :])
                given = self.headers.get("Content-Length") or "0"
                if not given.isdigit():
                    return self._error(400, f"Content-Length {given[:40]!r} is not a number")
                length = int(given)
                if not 0 < length <= MAX_UPLOAD:
                    return self._error(400, f"session upload of {length} bytes refused")
                body = self.rfile.read(length)
                if len(body) != length:
                    return self._error(400, "the upload ended before its Content-Length")
                self.close_connection = False
                write_atomic(file, lambda tmp: _write_checked_session(tmp, body))
                self._json(200, {"name": file.stem, "bytes": len(body)})
            except (SpinkvError, ValueError, OSError) as exc:
                self._error(400, str(exc))

        def _send_file(self, file: Path) -> None:
            stat = file.stat()
            size = stat.st_size
            etag = f'"{stat.st_mtime_ns:x}-{size:x}"'
            content_type = STATIC_TYPES.get(file.suffix) or (
                mimetypes.guess_type(file.name)[0] or "application/octet-stream"
            )
            headers = {
                "ETag": etag,
                "Last-Modified": email.utils.formatdate(stat.st_mtime, usegmt=True),
                "Accept-Ranges": "bytes",
            }
            # Model files never change under a name+mtime: let the browser keep them.
            cache = "max-age=31536000, immutable" if "/model/" in self.path else "no-cache"
            if self.headers.get("If-None-Match") == etag:
                self.send_response(HTTPStatus.NOT_MODIFIED)
                self._common_headers()
                self.send_header("ETag", etag)
                self.send_header("Cache-Control", cache)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            start, end = 0, size - 1
            status = 200
            wanted = self.headers.get("Range")
            if wanted:
                match = RANGE.match(wanted.strip())
                if match is None or (not match.group(1) and not match.group(2)):
                    return self._range_error(size)
                if match.group(1):
                    start = int(match.group(1))
                    end = int(match.group(2)) if match.group(2) else size - 1
                else:
                    start = max(0, size - int(match.group(2)))
                end = min(end, size - 1)
                if start > end or start >= size:
                    return self._range_error(size)
                status = 206
                headers["Content-Range"] = f"bytes {start}-{end}/{size}"
            self.send_response(status)
            self._common_headers()
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(end - start + 1))
            self.send_header("Cache-Control", cache)
            for key, value in headers.items():
                self.send_header(key, value)
            self.end_headers()
            if self.command == "HEAD":
                return
            with file.open("rb") as f:
                f.seek(start)
                left = end - start + 1
                while left > 0:
                    chunk = f.read(min(1 << 20, left))
                    if not chunk:
                        break
                    self.wfile.write(chunk)
                    left -= len(chunk)

        def _range_error(self, size: int) -> None:
            self._send_bytes(
                HTTPStatus.REQUESTED_RANGE_NOT_SATISFIABLE,
                b"",
                "text/plain",
                {"Content-Range": f"bytes */{size}"},
            )

    return Handler


def start_server(app: WebApp, host: str, port: int) -> ThreadingHTTPServer:
    """Binds and serves in a daemon thread; a taken port is a PortInUseError."""
    try:
        server = ThreadingHTTPServer((host, port), make_handler(app))
    except OSError as exc:
        if exc.errno in (98, 48):  # EADDRINUSE (Linux, macOS)
            raise PortInUseError(
                f"port {port} on {host} is already in use: stop what runs there or pick "
                "another with --port"
            ) from None
        raise SpinkvError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server
