"""Shared pytest configuration. `tests/` is on sys.path, so `support` is importable."""
