"""`spinkv web`: the chat page in a browser, the whole runtime in wasm (SIMD128)."""

from __future__ import annotations

import sys
import threading
from typing import Annotated

import typer

from spinkv.cli.options import ModelOption
from spinkv.cli.render import print_note, stdout

PortOption = Annotated[
    int,
    typer.Option("--port", "-p", min=0, max=65535, help="Port to listen on (0: any free port)."),
]
HostOption = Annotated[
    str,
    typer.Option("--host", help="Address to listen on (default: this machine only)."),
]


def web_command(
    model: ModelOption = None,
    port: PortOption = 8765,
    host: HostOption = "127.0.0.1",
) -> None:
    """Serve a chat page that runs the model in the browser (WebAssembly SIMD128, in a Web
    Worker): streaming chat, KV presets, cache and memory stats, sessions shared with the CLI."""
    from spinkv.errors import InvalidInputError
    from spinkv.models.store import resolve_model
    from spinkv.sessions.store import sessions_dir
    from spinkv.web.bundle import STATIC, build_bundle
    from spinkv.web.manifest import model_manifest
    from spinkv.web.server import WebApp, start_server

    if not host.strip():
        raise InvalidInputError(
            "--host is empty: give an address (127.0.0.1: this machine only; 0.0.0.0: every "
            "interface)"
        )

    model_dir = resolve_model(model)
    manifest = model_manifest(model_dir, name=model_dir.name)
    # The port first (a busy one is said at once), then the bundle, which can take minutes.
    app = WebApp(STATIC, None, model_dir, manifest, sessions_dir())
    app.serve_host(host)
    server = start_server(app, host, port)
    app.wasm = build_bundle(progress=print_note)
    bound = server.server_address[1]
    print_note(f"serving {model_dir.name} from {model_dir}; Ctrl-C stops")
    if host in ("0.0.0.0", "::"):
        print_note(
            f"listening on every interface ({host}): anyone who can reach this machine can "
            "read and upload sessions"
        )
        host = "127.0.0.1" if host == "0.0.0.0" else "[::1]"
    url_host = f"[{host}]" if ":" in host and not host.startswith("[") else host
    stdout.print(f"http://{url_host}:{bound}/", soft_wrap=True, highlight=False)
    sys.stdout.flush()
    try:
        threading.Event().wait()
    finally:
        server.shutdown()
