"""`spinkv eval`: KV cache quality against the fp16 cache on real text (KLD, top-1, passkey)."""
