"""Helpers every feature shares: files and locks, store names, progress, system facts,
safetensors writing, native calls kept quiet on stderr."""
