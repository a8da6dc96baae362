"""Ages as people write them: a unit always, ``m`` never. No database."""

from __future__ import annotations

import datetime as dt

import pytest

from django_rdbtasks.durations import FORMS, MAX_AGE, format_age, parse_age


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        ("7d", 7 * 86400),
        ("12h", 43200),
        ("30min", 1800),
        ("45s", 45),
        ("2w", 1209600),
        ("1d12h", 129600),
        ("1h30min", 5400),
        ("1.5h", 5400),
        (".5d", 43200),
        ("90 min", 5400),
        (" 7D ", 7 * 86400),
        ("3 days", 3 * 86400),
        ("1 week", 604800),
        ("2hours", 7200),
        ("10sec", 10),
        ("0s", 0),
        (dt.timedelta(minutes=2), 120),
        (dt.timedelta(0), 0),
    ],
)
def test_an_age_with_a_unit_is_read(value, seconds) -> None:
    assert parse_age(value).total_seconds() == seconds


@pytest.mark.parametrize("value", [7, 7.5, 0, True, "7", "7.5", " 30 ", "+7", "0"])
def test_a_bare_number_is_refused_with_the_accepted_forms(value) -> None:
    with pytest.raises(ValueError, match="has no unit") as refused:
        parse_age(value)
    assert FORMS in str(refused.value)


@pytest.mark.parametrize("value", ["1m", "30m", "1M", "1h30m", "2mo", "1month"])
def test_m_is_refused_as_minutes_or_months(value) -> None:
    with pytest.raises(ValueError, match="ambiguous") as refused:
        parse_age(value)
    assert "min for minutes" in str(refused.value) and "30d" in str(refused.value)


@pytest.mark.parametrize("value", ["", " ", "d", "7y", "seven days", "7d x", "7ms", "7d-1h"])
def test_what_is_not_an_age_is_refused_with_the_accepted_forms(value) -> None:
    with pytest.raises(ValueError) as refused:
        parse_age(value)
    assert FORMS in str(refused.value)


@pytest.mark.parametrize("value", ["-1d", "-7", dt.timedelta(seconds=-1)])
def test_a_negative_age_is_refused(value) -> None:
    with pytest.raises(ValueError):
        parse_age(value)


@pytest.mark.parametrize("value", [None, ["7d"], {"d": 7}])
def test_other_types_are_refused(value) -> None:
    with pytest.raises(ValueError, match="is not an age"):
        parse_age(value)


@pytest.mark.parametrize(
    ("age", "text"),
    [
        (dt.timedelta(days=7), "7d"),
        (dt.timedelta(days=1, hours=12), "1d12h"),
        (dt.timedelta(minutes=30), "30min"),
        (dt.timedelta(seconds=45.5), "45.5s"),
        (dt.timedelta(0), "0s"),
    ],
)
def test_format_age_reads_back(age, text) -> None:
    assert format_age(age) == text
    assert parse_age(text) == age


@pytest.mark.parametrize(
    "value",
    [
        "1" + "0" * 30 + "d",
        "1" + "0" * 400 + "d",  # inf as a float
        "99999999999d",
        # Issue 39: short of timedelta.max, but now - age is before year 1 (OverflowError).
        "99999999d",
        "36501d",
        dt.timedelta(days=99999999),
    ],
)
def test_an_age_too_long_to_subtract_from_now_is_refused_clearly(value) -> None:
    with pytest.raises(ValueError, match=r"too long an age: at most 36500d \(a hundred years\)"):
        parse_age(value)


def test_the_longest_age_can_be_subtracted_from_now() -> None:
    assert parse_age("36500d") == MAX_AGE == parse_age(MAX_AGE)
    assert (dt.datetime.now(dt.UTC) - parse_age("36500d")).year > 1900
