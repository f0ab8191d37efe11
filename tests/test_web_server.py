"""The `spinkv web` server's HTTP hygiene, in process and without the wasm bundle: bodies it
does not read end the connection, a quiet client times out, a foreign Host is refused."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from spinkv.web import server as web


@pytest.fixture
def address(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, int]]:
    monkeypatch.setattr(web, "SOCKET_TIMEOUT_S", 1.0)
    static = tmp_path / "static"
    static.mkdir()
    (static / "index.html").write_text("<html>spinkv</html>")
    app = web.WebApp(static, tmp_path / "x.wasm", tmp_path, {"files": []}, tmp_path / "s")
    app.serve_host("127.0.0.1")
    server = web.start_server(app, "127.0.0.1", 0)
    try:
        yield "127.0.0.1", server.server_address[1]
    finally:
        server.shutdown()


def exchange(address: tuple[str, int], request: bytes, wait_s: float = 3.0) -> bytes:
    """Everything the server sends back for request until it closes (or wait_s passes)."""
    with socket.create_connection(address, timeout=wait_s) as conn:
        conn.sendall(request)
        received = b""
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            try:
                chunk = conn.recv(65536)
            except TimeoutError:
                break
            if not chunk:
                break
            received += chunk
        return received


def test_a_refused_body_is_not_read_as_the_next_request(address: tuple[str, int]) -> None:
    smuggled = b"GET /api/sessions HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
    for head in (
        b"PUT /nope HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: %d\r\n\r\n",
        b"PUT /api/sessions/x HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\n"
        b"X-Length: %d\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: %d\r\n\r\n",
    ):
        answer = exchange(address, head % len(smuggled) + smuggled)
        assert answer.count(b"HTTP/1.1 ") == 1, answer


def test_a_body_shorter_than_its_length_times_out(address: tuple[str, int]) -> None:
    started = time.monotonic()
    answer = exchange(
        address,
        b"PUT /api/sessions/x HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 1000\r\n\r\nabc",
        wait_s=10,
    )
    assert time.monotonic() - started < 5  # the server closed: no thread held for good
    assert b"200 OK" not in answer


def test_a_foreign_host_is_refused(address: tuple[str, int]) -> None:
    for host in (b"evil.example", b"evil.example:80", b"127.0.0.1.evil.example"):
        answer = exchange(address, b"GET /api/sessions HTTP/1.1\r\nHost: " + host + b"\r\n\r\n")
        assert answer.startswith(b"HTTP/1.1 421"), answer
    for host in (b"127.0.0.1", b"localhost:%d" % address[1], b"[::1]:1"):
        answer = exchange(address, b"GET /api/sessions HTTP/1.1\r\nHost: " + host + b"\r\n\r\n")
        assert answer.startswith(b"HTTP/1.1 200"), answer


def test_a_length_that_is_not_a_number_is_named(address: tuple[str, int]) -> None:
    answer = exchange(
        address, b"PUT /api/sessions/x HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: abc\r\n\r\n"
    )
    body = answer.split(b"\r\n\r\n", 1)[1]
    assert answer.startswith(b"HTTP/1.1 400")
    assert "is not a number" in json.loads(body)["error"]


def test_host_of() -> None:
    assert web.host_of("LocalHost:8765") == "localhost"
    assert web.host_of("[::1]:8765") == "::1"
    assert web.host_of("127.0.0.1") == "127.0.0.1"
    assert web.host_of(None) is None
