"""How the admin writes values: one format per kind, errors once, tracebacks folded."""

from __future__ import annotations

import datetime as dt
import json

import pytest
from django.conf import settings
from django.utils import timezone

from tests.browser.support import require_admin

if "django.contrib.admin" in settings.INSTALLED_APPS:
    from django_rdbtasks.admin.display import (
        concurrency_text,
        count_text,
        cron_in_words,
        duration_text,
        error_message,
        last_error,
        redact,
        traceback_parts,
        when_text,
    )

pytestmark = pytest.mark.usefixtures("require_admin")
__all__ = ["require_admin"]


def test_redact_hides_secret_looking_keys_at_any_depth() -> None:
    value = {
        "url": "https://x",
        "headers": {"Authorization": "Bearer t", "X-Api-Key": "k", "Accept": "json"},
        "items": [{"password": "p", "name": "n"}],
    }
    shown = redact(value)
    assert shown["url"] == "https://x"
    assert shown["headers"]["Accept"] == "json"
    assert "t" not in json.dumps(shown["headers"]["Authorization"]).replace("hidden", "")
    assert shown["headers"]["X-Api-Key"] != "k"
    assert shown["items"][0] == {"password": shown["headers"]["X-Api-Key"], "name": "n"}
    assert value["headers"]["Authorization"] == "Bearer t"  # the original is untouched


def test_cron_in_words() -> None:
    assert cron_in_words("*/5 * * * *") == "Every 5 minutes"
    assert cron_in_words("0 3 * * *") == "At 03:00"
    assert cron_in_words("@daily") == "At 00:00"
    assert cron_in_words("not a cron") == "not a cron"


@pytest.mark.parametrize(
    ("seconds", "shown"),
    [
        (None, "—"),
        (0.0, "<1 ms"),
        (0.0004, "<1 ms"),
        (0.0015, "2 ms"),
        (0.25, "250 ms"),
        (12.34, "12.3 s"),
        (125, "2 min 5 s"),
        (7300, "2 h 1 min"),
        (3 * 86400 + 7200, "3 d 2 h"),
    ],
)
def test_durations(seconds: float | None, shown: str) -> None:
    assert duration_text(seconds) == shown


def test_one_date_format_with_seconds_and_zone() -> None:
    moment = dt.datetime(2026, 11, 22, 5, 17, 39, 123456, tzinfo=dt.UTC)
    assert when_text(moment) == "2026-11-22 05:17:39 UTC"
    with timezone.override("Europe/Berlin"):
        assert when_text(moment) == "2026-11-22 06:17:39 CET"
    assert when_text(None) == "—"


@pytest.mark.parametrize(
    ("class_path", "last_line", "message"),
    [
        (
            "app.tasks.PaymentGatewayError",
            "app.tasks.PaymentGatewayError: card declined",
            "card declined",
        ),
        ("builtins.ValueError", "ValueError: boom", "boom"),
        (
            "django_rdbtasks.exceptions.TaskCancelled",
            "django_rdbtasks.exceptions.TaskCancelled: cancelled by an operator",
            "cancelled by an operator",
        ),
        ("builtins.KeyError", "KeyError", ""),
        (
            "django_rdbtasks.exceptions.WorkerLost",
            "worker w stopped renewing",
            "worker w stopped renewing",
        ),
    ],
)
def test_error_message_drops_the_class_the_traceback_repeats(
    class_path: str, last_line: str, message: str
) -> None:
    assert (
        error_message(class_path, f"Traceback (most recent call last):\n  x\n{last_line}\n")
        == message
    )


def test_last_error_is_the_last_attempt_with_one() -> None:
    history = [
        {
            "outcome": "RETRY",
            "exception_class_path": "builtins.ValueError",
            "traceback": "ValueError: a",
        },
        {"outcome": "LOST"},
    ]
    summary = last_error(history)
    assert summary is not None and summary.one_line() == "ValueError: a"
    assert last_error([]) is None


def test_traceback_parts_fold_the_frames_of_the_queue_and_of_the_framework() -> None:
    traceback = "\n".join(
        [
            "Traceback (most recent call last):",
            '  File "/v/site-packages/django_rdbtasks/worker/process.py", line 1, in run',
            "    value = self._call(task)",
            '  File "/v/site-packages/django_tasks/base.py", line 2, in call',
            "    return self.func()",
            '  File "/srv/app/tasks.py", line 3, in charge',
            "    raise Boom()",
            "app.tasks.Boom: no",
        ]
    )
    parts = traceback_parts(traceback)
    assert [(p.framework, p.frames) for p in parts] == [(False, 0), (True, 2), (False, 1)]
    assert parts[1].text.count("File ") == 2
    assert parts[2].text.endswith("app.tasks.Boom: no")
    assert "".join(p.text for p in parts).count("\n") == traceback.count("\n") - 2


@pytest.mark.parametrize(
    ("threads", "batch", "expected"),
    [
        (1, 1, "optimistic, 1 thread, 1 task per claim"),
        (2, 10, "optimistic, 2 threads, 10 tasks per claim"),
        (1, 0, "optimistic, 1 thread, adaptive batch"),  # no --batch: the registry says 0
    ],
)
def test_concurrency_in_words_with_the_right_plural(threads: int, batch: int, expected: str):
    assert concurrency_text("optimistic", threads, batch) == expected


def test_counts_take_the_plural_of_their_number() -> None:
    one, many = "%(n)s task in the table", "%(n)s tasks in the table"
    assert count_text(one, many, 1) == "1 task in the table"
    assert count_text(one, many, 0) == "0 tasks in the table"
    assert count_text(one, many, 1042) == "1,042 tasks in the table"
