"""Saved conversations and prompt caches: the session store and `spinkv sessions`."""
