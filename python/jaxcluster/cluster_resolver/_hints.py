"""Wording shared by resolver error messages: job lists and "did you mean" suggestions."""

from __future__ import annotations

import difflib
from collections.abc import Iterable

__all__ = ["did_you_mean", "format_choices"]


def format_choices(choices: Iterable[object]) -> str:
    """``"chief, worker"``, or ``"none"`` when there are no choices."""
    text = ", ".join(str(c) for c in choices)
    return text or "none"


def did_you_mean(value: object, choices: Iterable[str]) -> str:
    """``"; did you mean 'worker'?"`` when ``value`` is close to one choice, else ``""``."""
    if not isinstance(value, str):
        return ""
    candidates = list(choices)
    match = difflib.get_close_matches(value, candidates, n=1, cutoff=0.6)
    if not match:
        lowered = {c.lower(): c for c in candidates}
        if value.lower() in lowered:
            match = [lowered[value.lower()]]
    return f"; did you mean {match[0]!r}?" if match else ""
