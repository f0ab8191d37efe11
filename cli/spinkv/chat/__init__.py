"""`spinkv chat` (the streaming REPL) and `spinkv run` (one reply)."""
