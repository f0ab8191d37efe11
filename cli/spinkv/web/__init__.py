"""`spinkv web` and the wasm runtime: bundle build, model manifest, HTTP server, node runner."""
