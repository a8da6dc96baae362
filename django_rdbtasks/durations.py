"""Ages and durations written by people: ``7d``, ``12h``, ``30min``, ``45s``.

Every age the project accepts (``prunetasks --older-than``, ``RDBTASKS_RETENTION``,
``requeue --since``, ``rdbtasks status --window``) goes through ``parse_age``.
A unit is required: a bare ``7`` was once read as seconds and deleted every
finished task, where its writer meant a week. ``m`` is refused too, because
half of the readers take ``1m`` for a month.
"""

from __future__ import annotations

import datetime as dt
import re

#: Seconds per unit, by every spelling accepted.
UNITS: dict[str, int] = {
    **dict.fromkeys(("w", "week", "weeks"), 604800),
    **dict.fromkeys(("d", "day", "days"), 86400),
    **dict.fromkeys(("h", "hr", "hrs", "hour", "hours"), 3600),
    **dict.fromkeys(("min", "mins", "minute", "minutes"), 60),
    **dict.fromkeys(("s", "sec", "secs", "second", "seconds"), 1),
}

#: What the messages show as the accepted forms.
FORMS = "7d, 12h, 30min, 45s, 2w or 1d12h (or a datetime.timedelta in settings)"

#: The longest age accepted. Every age is subtracted from the database clock
#: (``now - age``), and a ``timedelta`` far short of ``timedelta.max`` already
#: takes that below year 1 (``OverflowError``); MySQL's DATETIME starts at year
#: 1000. A hundred years is older than any task, so it still means "all of them".
MAX_AGE = dt.timedelta(days=36500)

_PART = re.compile(r"(\d+(?:\.\d+)?|\.\d+)([a-z]+)")
_NUMBER = re.compile(r"[+-]?(\d+(\.\d*)?|\.\d+)")


def parse_age(value: object) -> dt.timedelta:
    """A non-negative ``timedelta`` from ``value``, or ``ValueError`` saying what is accepted.

    ``value`` is a ``timedelta`` or text of one or more number-and-unit parts:
    ``"7d"``, ``"1d12h"``, ``"1.5h"``, ``"90 min"``; at most ``MAX_AGE``, so
    that ``now - age`` is a time every database can compare with.
    """
    if isinstance(value, dt.timedelta):
        if value < dt.timedelta(0):
            raise ValueError(f"{value!r} is negative; an age is 0 or more: {FORMS}.")
        return _at_most_max(value, value)
    if isinstance(value, bool | int | float):
        raise ValueError(f"{value!r} has no unit: write an age like {FORMS}.")
    if not isinstance(value, str):
        raise ValueError(f"{value!r} is not an age: write one like {FORMS}.")
    text = value.strip().lower().replace(" ", "")
    if _NUMBER.fullmatch(text):
        raise ValueError(f"{value!r} has no unit: write an age like {FORMS}.")
    parts = _PART.findall(text)
    if not text or _PART.sub("", text):
        raise ValueError(f"{value!r} is not an age: write one like {FORMS}.")
    seconds = 0.0
    for number, unit in parts:
        if unit in ("m", "mo", "mon", "month", "months"):
            raise ValueError(
                f"{value!r} is ambiguous ('{number}{unit}': minutes or months?): "
                f"write {number}min for minutes, or days such as 30d for a month."
            )
        if unit not in UNITS:
            raise ValueError(f"{value!r}: {unit!r} is not a unit; write an age like {FORMS}.")
        seconds += float(number) * UNITS[unit]
    if seconds > MAX_AGE.total_seconds():
        raise _too_long(value)
    return dt.timedelta(seconds=seconds)


def _at_most_max(age: dt.timedelta, value: object) -> dt.timedelta:
    if age > MAX_AGE:
        raise _too_long(value)
    return age


def _too_long(value: object) -> ValueError:
    return ValueError(
        f"{value!r} is too long an age: at most {MAX_AGE.days}d (a hundred years), "
        "which already reaches back before any task."
    )


def format_age(age: dt.timedelta) -> str:
    """``age`` in the largest units that divide it, as ``parse_age`` reads it back."""
    total = age.total_seconds()
    if total == 0:
        return "0s"
    parts = []
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        count, total = divmod(total, size)
        if count:
            parts.append(f"{int(count)}{unit}")
    if total:
        parts.append(f"{total:g}s")
    return "".join(parts)
