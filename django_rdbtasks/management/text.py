"""What the commands print and refuse with: counts with their noun, every problem at once."""

from __future__ import annotations

from collections.abc import Sequence

from django.core.management.base import CommandError


def counted(n: int, singular: str, plural: str | None = None) -> str:
    """``1 task``, ``12 tasks``, ``1,042 batches``: the count and its noun, in agreement."""
    noun = singular if n == 1 else (plural or singular + "s")
    return f"{n:,} {noun}"


def refuse(problems: Sequence[str]) -> None:
    """Raise one ``CommandError`` naming every problem, before the command has done anything.

    One at a time would make an operator fix a typo, run again and meet the
    next; all of them are found first and reported together.
    """
    if problems:
        if len(problems) == 1:
            raise CommandError(problems[0])
        raise CommandError("\n".join(["Refused, nothing was done:", *(f"  {p}" for p in problems)]))
