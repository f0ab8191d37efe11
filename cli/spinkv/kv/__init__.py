"""KV cache options and presets as the API takes them, and `spinkv cache stats`."""
