"""``manage.py prunetasks --older-than 7d``: delete old finished tasks, a batch at a time.

Nothing a typo can destroy: an age without a unit is refused (``durations``),
and a deletion of more than ``--confirm-above`` tasks asks first, or needs
``--yes`` where nobody can answer. Only finished tasks are ever deleted.
"""

from __future__ import annotations

import datetime as dt
import math
import sys
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import router

from ...durations import FORMS, format_age, parse_age
from ...jobs import database_now
from ...models import Task
from ...retention import (
    CONFIRM_ABOVE,
    DEFAULT_BATCH_SIZE,
    FINISHED,
    PruneResult,
    count_prunable_by_queue,
    prune,
    prune_by_setting,
    retention_setting,
)
from ..text import counted, refuse


class Command(BaseCommand):
    help = (
        f"Delete tasks that finished ({', '.join(FINISHED[:-1])} or {FINISHED[-1].value}) "
        "longer ago than --older-than, in short batches that never hold the table for long."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--older-than",
            metavar="AGE",
            help=f"Finished longer ago than this, with a unit: {FORMS.split(' (')[0]} "
            "(database clock).",
        )
        parser.add_argument(
            "--status",
            action="append",
            dest="statuses",
            choices=[s.value for s in FINISHED],
            type=str.upper,
            metavar="STATUS",
            help=f"Only this final status ({', '.join(FINISHED)}); repeat for more. "
            "Default: all three.",
        )
        parser.add_argument(
            "--by-setting",
            action="store_true",
            help="Apply RDBTASKS_RETENTION (ages per status) instead of --older-than.",
        )
        parser.add_argument(
            "--dry-run",
            action="store_true",
            help="Count what would be deleted, by status and queue; delete nothing.",
        )
        parser.add_argument(
            "--yes",
            "-y",
            action="store_true",
            help="Do not ask before a deletion of more than --confirm-above tasks.",
        )
        parser.add_argument(
            "--no-input",
            "--noinput",
            action="store_false",
            dest="interactive",
            help="The same as --yes, as Django's commands spell it.",
        )
        parser.add_argument(
            "--confirm-above",
            type=int,
            default=CONFIRM_ABOVE,
            metavar="N",
            help=f"Ask before deleting more than N tasks (default {CONFIRM_ABOVE:,}).",
        )
        parser.add_argument(
            "--batch-size",
            type=int,
            default=DEFAULT_BATCH_SIZE,
            help=f"Rows per delete statement and transaction (default {DEFAULT_BATCH_SIZE}).",
        )
        parser.add_argument(
            "--pause",
            type=float,
            default=0.0,
            metavar="SECONDS",
            help="Sleep between batches to leave the database to the workers (default 0).",
        )
        parser.add_argument("--database", default=None, help="The database alias of the tasks.")

    def handle(self, *args: Any, **options: Any) -> None:
        age = self._refuse_bad_arguments(options)
        using = options["database"] or router.db_for_write(Task)
        if options["by_setting"]:
            self._by_setting(using, options)
            return
        assert age is not None
        statuses = options["statuses"] or list(FINISHED)
        # One clock for the count and the deletion: what was confirmed is what goes.
        now = database_now(using)
        counts = (
            count_prunable_by_queue(age, statuses, using=using, now=now)
            if self._counts_needed(options)
            else {}
        )
        what = f"finished more than {format_age(age)} ago"
        if options["dry_run"]:
            self._report(f"Would delete {counted(sum(counts.values()), 'task')} {what}", counts)
            return
        self._confirm(what, counts, options)
        result = prune(
            age,
            statuses,
            using=using,
            batch_size=options["batch_size"],
            pause=options["pause"],
            progress=self._progress if options["verbosity"] >= 2 else None,
            now=now,
        )
        self.stdout.write(
            f"Deleted {counted(result.total, 'task')} in "
            f"{counted(result.batches, 'batch', 'batches')}: {self._by_status(result.deleted)}."
        )

    @staticmethod
    def _refuse_bad_arguments(options: dict[str, Any]) -> dt.timedelta | None:
        """Every problem of the arguments at once, before anything is counted or deleted.

        Returns the ``--older-than`` age (None with ``--by-setting``).
        """
        problems = []
        if options["batch_size"] < 1:
            problems.append("--batch-size must be at least 1.")
        if options["confirm_above"] < 0:
            problems.append("--confirm-above must be 0 or more.")
        pause = options["pause"]
        if not (0 <= pause < math.inf):  # NaN too: argparse's float() takes "nan"
            problems.append(f"--pause must be 0 or more seconds, not {pause:g}.")
        age = None
        if options["by_setting"]:
            if options["older_than"] or options["statuses"]:
                problems.append("--by-setting takes its ages and statuses from the setting.")
        elif not options["older_than"]:
            problems.append("Say how old: --older-than 7d (or --by-setting).")
        else:
            try:
                age = parse_age(options["older_than"])
            except ValueError as exc:
                problems.append(f"--older-than: {exc}")
        if options["by_setting"] and not problems:
            try:
                retention_setting()
            except ImproperlyConfigured as exc:
                problems.append(str(exc))
        refuse(problems)
        return age

    def _by_setting(self, using: str, options: dict[str, Any]) -> None:
        ages = retention_setting()  # read without error by _refuse_bad_arguments
        now = database_now(using)
        counts: dict[tuple[str, str], int] = {}
        if self._counts_needed(options):
            for status, age in ages.items():
                counts.update(count_prunable_by_queue(age, [status], using=using, now=now))
        if options["dry_run"]:
            if not ages:
                self.stdout.write("RDBTASKS_RETENTION is not set: nothing would be deleted.")
                return
            for status, age in ages.items():
                n = sum(v for (s, _), v in counts.items() if s == status)
                older = format_age(age)
                self.stdout.write(
                    f"Would delete {counted(n, f'{status} task')} older than {older}."
                )
            self._report("", counts)
            return
        self._confirm("past RDBTASKS_RETENTION", counts, options)
        result = prune_by_setting(
            using=using, time_budget=None, batch_size=options["batch_size"], now=now
        )
        if result is None:
            raise CommandError("Another process is pruning right now; try again later.")
        self.stdout.write(
            f"Deleted {counted(result.total, 'task')} ({self._by_status(result.deleted)}) "
            f"and {counted(result.workers, 'row')} of gone workers."
        )

    @staticmethod
    def _counts_needed(options: dict[str, Any]) -> bool:
        """Whether anyone reads the counts: a dry run shows them, a question quotes them.

        With ``--yes`` or ``--no-input`` nothing does, and on a table of
        millions of finished rows the count is a scan of their index.
        """
        return options["dry_run"] or (options["interactive"] and not options["yes"])

    def _confirm(self, what: str, counts: dict[tuple[str, str], int], options: dict) -> None:
        """Ask before a large deletion; without a terminal to ask on, refuse it."""
        if not self._counts_needed(options):
            return
        total = sum(counts.values())
        if total <= options["confirm_above"]:
            return
        self._report(f"About to delete {counted(total, 'task')} {what}", counts)
        if not sys.stdin.isatty():
            raise CommandError(
                f"Refusing to delete {counted(total, 'task')} (more than "
                f"{options['confirm_above']:,}) "
                "without confirmation, and there is no terminal to ask on: run with --yes "
                "(or --no-input) to delete them, or --dry-run to see them. Nothing was deleted."
            )
        these = "this task" if total == 1 else f"these {total:,} tasks"
        answer = input(f"Delete {these}? Type 'yes' to continue: ")
        if answer.strip().lower() not in ("yes", "y"):
            raise CommandError("Nothing was deleted.")

    def _report(self, headline: str, counts: dict[tuple[str, str], int]) -> None:
        """The headline with the counts by status, then one line per status and queue."""
        if headline:
            by_status: dict[str, int] = {}
            for (status, _), n in counts.items():
                by_status[status] = by_status.get(status, 0) + n
            self.stdout.write(f"{headline}: {self._by_status(by_status)}.")
        for (status, queue), n in sorted(counts.items()):
            if n:
                self.stdout.write(f"  {status} in queue {queue}: {n:,}")

    def _progress(self, result: PruneResult) -> None:
        self.stdout.write(f"  batch {result.batches}: {result.total:,} deleted so far")

    @staticmethod
    def _by_status(counts: dict[str, int]) -> str:
        parts = [f"{status} {n:,}" for status, n in sorted(counts.items()) if n]
        return ", ".join(parts) or "none"
