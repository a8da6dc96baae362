"""What every supported database can store: the one rule for a task's data.

Each database refuses some values the others take. PostgreSQL stores no NUL
character in ``text`` or ``jsonb`` (``\\u0000``); PostgreSQL and MariaDB take
no lone UTF-16 surrogate in JSON (``\\ud800`` without its pair) and no driver
can send one in a text parameter; MariaDB refuses a statement over
``max_allowed_packet`` (16 MiB by default, MySQL 8's 64 MiB), PostgreSQL a
``jsonb`` value over 255 MiB. So a task's data is held to what all of them
take, wherever it runs: what SQLite accepts in development is accepted in
production, and nothing reaches a database that would refuse it.

- Arguments (``arguments.py``) and checkpoints (``context.py``) are the
  caller's data, kept as they are or refused: ``problem_in`` names the first
  value that no database would store.
- A result (``worker/execution.py``) is refused the same way, which fails the
  task, not retried: the same value would be refused again.
- Error messages, tracebacks and progress messages are text for people, kept
  readable rather than refused: ``escape_unstorable`` writes a NUL and a lone
  surrogate as their escapes; ``readable_text`` also cuts what is over its
  limit, with a note.

Sizes are those of the JSON text as stored (``json.dumps``'s ASCII form: one
byte a character), with limits set by the backend's ``OPTIONS``
(``StorageLimits``), each far below every database's own.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .exceptions import ValueNotStorable

KIB = 1024
MIB = 1024 * KIB

#: Defaults, far below MariaDB's default ``max_allowed_packet`` (16 MiB) for a
#: whole outcome's statement and below MySQL 5.7's 4 MiB: a result, an error
#: and a history entry together stay under 2 MiB.
DEFAULT_MAX_ARGUMENTS_BYTES = MIB
DEFAULT_MAX_RESULT_BYTES = MIB
DEFAULT_MAX_ERROR_BYTES = 64 * KIB
DEFAULT_MAX_CHECKPOINT_BYTES = MIB
#: ``Task.progress_message``'s column.
PROGRESS_MESSAGE_CHARS = 200

#: A character no supported database stores in every place a task's data goes.
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")
#: In JSON text as ``json.dumps`` writes it (ASCII), where such a character
#: may be: ``\u0000`` or an escape of a surrogate. A character outside the BMP
#: is written as a pair of surrogates too, so this only says where to look.
_SUSPECT_ESCAPE = re.compile(r"\\u(?:0000|d[89a-f])")
_encode = json.JSONEncoder(allow_nan=False).encode


@dataclass(frozen=True, slots=True)
class StorageLimits:
    """The most bytes of each kind of a task's data, as stored (``OPTIONS``)."""

    arguments: int = DEFAULT_MAX_ARGUMENTS_BYTES
    result: int = DEFAULT_MAX_RESULT_BYTES
    error: int = DEFAULT_MAX_ERROR_BYTES
    checkpoint: int = DEFAULT_MAX_CHECKPOINT_BYTES


#: The option that sets each limit, for the messages that name it.
LIMIT_OPTIONS = {
    "arguments": "MAX_ARGUMENTS_BYTES",
    "result": "MAX_RESULT_BYTES",
    "error": "MAX_ERROR_BYTES",
    "checkpoint": "MAX_CHECKPOINT_BYTES",
}


def may_hold_unstorable(json_text: str) -> bool:
    """Whether JSON text (ASCII, as ``json.dumps`` writes it) may hold a character
    no database stores. False for nearly all text, at the cost of a search."""
    return "\\u" in json_text and _SUSPECT_ESCAPE.search(json_text) is not None


def character_problem(text: str) -> str | None:
    """What in ``text`` no database stores (a NUL, a lone surrogate), or None."""
    found = _UNSTORABLE.search(text)
    if found is None:
        return None
    char = found.group()
    if char == "\x00":
        return (
            f"holds a NUL character (\\x00) at index {found.start()}, which PostgreSQL "
            "cannot store in text or JSON"
        )
    return (
        f"holds a lone UTF-16 surrogate ({char!r}) at index {found.start()}, which is "
        "no Unicode character: it cannot be encoded as UTF-8, and PostgreSQL and MariaDB "
        "refuse it in JSON"
    )


def problem_in(value: Any, where: str) -> str | None:
    """The first string (or dict key) under a JSON value that no database stores,
    named from ``where``: ``args[0]['name'] holds a NUL character ...``."""
    if isinstance(value, str):
        problem = character_problem(value)
        return f"{where} {problem}" if problem else None
    if isinstance(value, Mapping):
        for key, item in value.items():
            if isinstance(key, str):
                problem = character_problem(key)
                if problem:
                    return f"{where} has a key {key!r} that {problem}"
            found = problem_in(item, f"{where}[{key!r}]")
            if found:
                return found
        return None
    if isinstance(value, Sequence) and not isinstance(value, bytes | bytearray):
        for index, item in enumerate(value):
            found = problem_in(item, f"{where}[{index}]")
            if found:
                return found
    return None


def size_problem(size: int, limit: int, kind: str) -> str | None:
    """Why ``size`` bytes of ``kind`` (a ``StorageLimits`` field) are too many, or None."""
    if size <= limit:
        return None
    return (
        f"{size:,} bytes as JSON, over the limit of {limit:,} "
        f"(the task backend's OPTIONS[{LIMIT_OPTIONS[kind]!r}])"
    )


def json_problem(value: Any, json_text: str, where: str, limit: int, kind: str) -> str | None:
    """Why ``value``, whose JSON is ``json_text``, cannot be stored as ``kind``, or None."""
    if may_hold_unstorable(json_text):
        found = problem_in(value, where)
        if found:
            return found
    too_big = size_problem(len(json_text), limit, kind)
    return f"{where} is {too_big}" if too_big else None


def encode_storable(value: Any, where: str, limit: int, kind: str) -> str:
    """``value`` as stored JSON text; ``ValueNotStorable`` if a database would refuse it.

    ``TypeError``/``ValueError`` as ``json.dumps`` raises them for what is not
    JSON at all (a set, NaN).
    """
    text = _encode(value)
    problem = json_problem(value, text, where, limit, kind)
    if problem:
        raise ValueNotStorable(f"{problem}.")
    return text


def readable_text(text: str, limit: int, what: str = "text") -> str:
    """``text`` as every database stores it, at most ``limit`` bytes as stored JSON.

    A NUL is written ``\\x00`` and a lone surrogate as its escape (``\\ud800``);
    text over the limit keeps its beginning and ends with a note of how much
    was cut. Returned as it is in the usual case: nothing to replace, and too
    short to be over (a character is at most 12 bytes as stored JSON).
    """
    text = escape_unstorable(text)
    if len(text) * 12 <= limit:
        return text
    stored = _stored_size(text)
    if stored <= limit:
        return text
    note = f"\n[{what} cut: {stored:,} bytes as stored, over the limit of {limit:,}]"
    keep = max(0, limit - _stored_size(note))
    # The longest beginning that fits: a character is one byte or more.
    low, high = 0, min(len(text), keep)
    while low < high:
        middle = (low + high + 1) // 2
        if _stored_size(text[:middle]) <= keep:
            low = middle
        else:
            high = middle - 1
    return text[:low] + note


def escape_unstorable(text: str) -> str:
    """``text`` with a NUL written ``\\x00`` and a lone surrogate as its escape."""
    if _UNSTORABLE.search(text) is None:
        return text
    return _UNSTORABLE.sub(_escaped, text)


def _stored_size(text: str) -> int:
    """Bytes of ``text`` inside stored JSON (its escapes included, not its quotes)."""
    return len(_encode(text)) - 2


def _escaped(match: re.Match[str]) -> str:
    char = match.group()
    return "\\x00" if char == "\x00" else f"\\u{ord(char):04x}"
