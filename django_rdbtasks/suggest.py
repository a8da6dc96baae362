"""The nearest valid name to a misspelt one, for error messages and system checks."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


def nearest(name: str, known: Iterable[str], n: int = 3) -> list[str]:
    """The known names closest to ``name`` (difflib's ratio of 0.6 or more), best first."""
    return difflib.get_close_matches(name, sorted(set(known)), n=n)


def did_you_mean(name: str, known: Iterable[str]) -> str:
    """`` Did you mean 'emails'?`` (with a leading space), or nothing when none is close."""
    near = nearest(name, known)
    if not near:
        return ""
    return " Did you mean " + " or ".join(repr(candidate) for candidate in near) + "?"
