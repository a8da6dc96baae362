"""How the admin writes values: times, durations, statuses, JSON, errors and tracebacks.

One function per kind of value, so that every page writes it the same way.
"""

from __future__ import annotations

import datetime as dt
import json
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from django.utils import timezone, translation
from django.utils.formats import number_format
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString, mark_safe
from django.utils.translation import gettext_lazy as _
from django.utils.translation import ngettext

from ..states import TaskStatus

#: Keys whose values are never shown (HTTP task headers, credentials in kwargs).
SECRET_KEY_PATTERN = re.compile(
    r"pass(word|wd)?|secret|token|authori[sz]ation|api[-_]?key|cookie|credential|private[-_]?key",
    re.IGNORECASE,
)
REDACTED = "•••••• (hidden)"
#: JSON longer than this is cut in the page (the row keeps all of it).
JSON_DISPLAY_LIMIT = 100_000
#: The one format of a moment, everywhere in the admin.
WHEN_FORMAT = "%Y-%m-%d %H:%M:%S %Z"
EMPTY = "—"


# -- times and durations -------------------------------------------------------------------


def when_text(value: dt.datetime | None, zone: dt.tzinfo | None = None) -> str:
    """``2026-11-22 05:17:39 UTC``: in the active time zone unless ``zone`` is given."""
    if value is None:
        return EMPTY
    local = value.astimezone(zone) if zone is not None else timezone.localtime(value)
    return local.strftime(WHEN_FORMAT)


def when(value: dt.datetime | None, zone: dt.tzinfo | None = None) -> SafeString | str:
    """A moment as ``when_text`` writes it, machine-readable in a ``<time>`` element."""
    if value is None:
        return EMPTY
    return format_html('<time datetime="{}">{}</time>', value.isoformat(), when_text(value, zone))


def duration_text(seconds: float | None) -> str:
    """A duration to read at a glance; "<1 ms" rather than a misleading "0 ms"."""
    if seconds is None:
        return EMPTY
    if seconds < 0.001:
        return "<1 ms"
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes} min {secs} s"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours} h {minutes} min"
    return f"{hours // 24} d {hours % 24} h"


def parse_when(value: Any) -> dt.datetime | None:
    """History entries store ISO 8601 strings."""
    if not value:
        return None
    try:
        moment = dt.datetime.fromisoformat(str(value))
    except ValueError:
        return None
    return moment if moment.tzinfo else moment.replace(tzinfo=dt.UTC)


# -- statuses, workers, JSON ---------------------------------------------------------------


def status_badge(status: str, label: Any = None, title: Any = "") -> SafeString:
    """A coloured label; ``status`` picks the colour (a TaskStatus or a CSS name)."""
    if label is None:
        label = TaskStatus(status).label if status in TaskStatus.values else status.title()
    return format_html(
        '<span class="rdbtasks-badge rdbtasks-{}" title="{}">{}</span>',
        status.lower(),
        title,
        label,
    )


def concurrency_text(mode: str, threads: int, batch: int) -> str:
    """``optimistic, 2 threads, 1 task per claim``: how a worker process runs its tasks.

    The registry stores 0 for a batch chosen as the worker goes (no ``--batch``).
    """
    parts = [
        str(mode),
        ngettext("%(n)d thread", "%(n)d threads", threads) % {"n": threads},
        str(_("adaptive batch"))
        if not batch
        else ngettext("%(n)d task per claim", "%(n)d tasks per claim", batch) % {"n": batch},
    ]
    return ", ".join(parts)


def count_text(singular: str, plural: str, n: int) -> str:
    """``1 task`` / ``1,042 tasks``: ``singular`` and ``plural`` hold ``%(n)s``."""
    return ngettext(singular, plural, n) % {"n": number_format(n, force_grouping=True)}


#: Where a dotted path, a snake_case name or a worker id may wrap in a narrow column.
BREAK_AFTER = re.compile(r"(?<=[._:])")


def breakable(text: str) -> SafeString:
    """``text`` escaped, with a line-break opportunity after each ``.``, ``_`` and ``:``.

    A list shows the whole task name rather than cutting it; without these a
    long name would break between any two letters.
    """
    return format_html_join(mark_safe("<wbr>"), "{}", ((part,) for part in BREAK_AFTER.split(text)))


def short_worker(worker_id: str) -> str:
    """``host:pid`` of a worker id (``host:pid:lane:random``): the Worker row's name."""
    parts = worker_id.split(":")
    return ":".join(parts[:2]) if len(parts) > 2 else worker_id


def redact(value: Any) -> Any:
    """A copy of ``value`` with the values of secret-looking keys hidden."""
    if isinstance(value, dict):
        return {
            key: REDACTED if SECRET_KEY_PATTERN.search(str(key)) else redact(item)
            for key, item in value.items()
        }
    if isinstance(value, list):
        return [redact(item) for item in value]
    return value


def pretty_json(value: Any) -> SafeString:
    if value is None:
        return format_html('<span class="rdbtasks-muted">{}</span>', "null")
    text = json.dumps(redact(value), indent=2, ensure_ascii=False, sort_keys=False)
    note = ""
    if len(text) > JSON_DISPLAY_LIMIT:
        note = f"\n… cut at {JSON_DISPLAY_LIMIT:,} of {len(text):,} characters"
        text = text[:JSON_DISPLAY_LIMIT]
    return format_html('<pre class="rdbtasks-json">{}{}</pre>', text, note)


# -- errors --------------------------------------------------------------------------------


def error_message(class_path: str, traceback: str) -> str:
    """The exception's message alone, from the last line of its traceback.

    Python ends a traceback with ``ValueError: boom`` for a builtin and with
    ``app.tasks.PaymentGatewayError: boom`` for anything else; an error
    summary that puts the class beside this line would say it twice.
    """
    lines = [line for line in str(traceback or "").splitlines() if line.strip()]
    if not lines:
        return ""
    last = lines[-1].strip()
    short = class_path.rpartition(".")[2]
    for name in dict.fromkeys((class_path, short)):
        if name and last == name:
            return ""
        if name and last.startswith(f"{name}: "):
            return last[len(name) + 2 :]
    return last


@dataclass(frozen=True, slots=True)
class ErrorSummary:
    class_path: str
    message: str

    @property
    def name(self) -> str:
        return self.class_path.rpartition(".")[2]

    def one_line(self) -> str:
        """``PaymentGatewayError: card declined``, for a list's cell."""
        return f"{self.name}: {self.message}" if self.message else self.name


def last_error(history: Iterable[dict[str, Any]]) -> ErrorSummary | None:
    """The error of the last attempt that had one."""
    for entry in reversed(list(history or ())):
        class_path = str(entry.get("exception_class_path") or "")
        if class_path:
            return ErrorSummary(class_path, error_message(class_path, entry.get("traceback", "")))
    return None


def error_cell(summary: ErrorSummary | None, limit: int = 200) -> SafeString | str:
    """One line in a list, cut by the column's width; all of it on hover."""
    if summary is None:
        return ""
    full = f"{summary.class_path}: {summary.message}" if summary.message else summary.class_path
    return format_html(
        '<span class="rdbtasks-error" title="{}">{}</span>', full, summary.one_line()[:limit]
    )


# -- tracebacks ----------------------------------------------------------------------------

#: Frames of the queue itself and of the framework: the same in every traceback,
#: so they are folded away and the task's own frames stand out.
FRAMEWORK_FRAME = re.compile(
    r'^\s*File "[^"]*[/\\](django_rdbtasks|django[/\\]tasks|django_tasks)[/\\]'
)
FRAME_START = re.compile(r'^\s*File "')


@dataclass(frozen=True, slots=True)
class TracebackPart:
    text: str
    #: Frames of the framework, shown folded.
    framework: bool
    frames: int = 0


def _frames(lines: list[str]) -> Iterator[tuple[list[str], bool]]:
    """Lines grouped into frames (a ``File`` line and its source) and other lines."""
    group: list[str] = []
    in_frame = False
    for line in lines:
        starts_frame = bool(FRAME_START.match(line))
        # A frame's source lines are indented deeper than its "File" line.
        continues = in_frame and line.startswith("    ") and not starts_frame
        if continues:
            group.append(line)
            continue
        if group:
            yield group, in_frame
        group, in_frame = [line], starts_frame
    if group:
        yield group, in_frame


def traceback_parts(traceback: str) -> list[TracebackPart]:
    """The traceback in runs of lines, the framework's frames in runs of their own."""
    parts: list[TracebackPart] = []
    run: list[str] = []
    run_frames = 0
    run_framework = False

    def close() -> None:
        if run:
            parts.append(TracebackPart("\n".join(run), run_framework, run_frames))

    for lines, is_frame in _frames(str(traceback or "").splitlines()):
        framework = is_frame and bool(FRAMEWORK_FRAME.match(lines[0]))
        if framework != run_framework:
            close()
            run, run_frames, run_framework = [], 0, framework
        run.extend(lines)
        run_frames += int(is_frame)
    close()
    return parts


def traceback_html(traceback: str) -> SafeString:
    """A traceback whose long lines wrap, with the framework's frames folded."""

    def part_html(part: TracebackPart) -> SafeString:
        if not part.framework:
            return format_html("<pre>{}</pre>", part.text)
        label = ngettext(
            "%(n)d frame of the task queue", "%(n)d frames of the task queue", part.frames
        ) % {"n": part.frames}
        return format_html(
            '<details class="rdbtasks-frames"><summary>{}</summary><pre>{}</pre></details>',
            label,
            part.text,
        )

    return format_html(
        '<div class="rdbtasks-traceback">{}</div>',
        format_html_join("", "{}", ((part_html(p),) for p in traceback_parts(traceback))),
    )


# -- cron ----------------------------------------------------------------------------------

#: cronsim's shorthands, which cron-descriptor does not read.
CRON_ALIASES = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}


def cron_in_words(cron: str) -> str:
    """ "At 02:30, Monday through Friday", in the active language where cron-descriptor has it."""
    from cron_descriptor import ExpressionDescriptor, Options

    options = Options()
    options.use_24hour_time_format = True
    # cron-descriptor names locales like de_DE and falls back to English.
    language = translation.to_locale(translation.get_language() or "en-us")
    options.locale_code = language if "_" in language else f"{language}_{language.upper()}"
    expression = CRON_ALIASES.get(cron.strip().lower(), cron)
    try:
        return ExpressionDescriptor(expression, options).get_description()
    except Exception:  # a form cronsim accepts but cron-descriptor does not
        return cron
