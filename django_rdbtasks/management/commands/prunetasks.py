"""``manage.py prunetasks --older-than 7d``: delete old finished tasks, a batch at a time."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from ...retention import (
    DEFAULT_BATCH_SIZE,
    FINISHED,
    PruneResult,
    count_prunable,
    parse_age,
    prune,
    prune_by_setting,
)


class Command(BaseCommand):
    help = (
        f"Delete tasks that finished ({', '.join(FINISHED[:-1])} or {FINISHED[-1].value}) "
        "longer ago than --older-than, in short batches that never hold the table for long."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--older-than",
            metavar="AGE",
            help="Finished longer ago than this: 7d, 12h, 90m, 2w (database clock).",
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
            "--dry-run", action="store_true", help="Count what would be deleted; delete nothing."
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
        if options["batch_size"] < 1:
            raise CommandError("--batch-size must be at least 1.")
        if options["by_setting"]:
            if options["older_than"] or options["statuses"]:
                raise CommandError("--by-setting takes its ages and statuses from the setting.")
            self._by_setting(options)
            return
        if not options["older_than"]:
            raise CommandError("Say how old: --older-than 7d (or --by-setting).")
        try:
            age = parse_age(options["older_than"])
        except ValueError as exc:
            raise CommandError(str(exc)) from exc
        statuses = options["statuses"] or list(FINISHED)
        if options["dry_run"]:
            counts = count_prunable(age, statuses, using=options["database"])
            self.stdout.write(
                f"Would delete {sum(counts.values()):,} tasks finished more than "
                f"{options['older_than']} ago: {self._by_status(counts)}."
            )
            return
        result = prune(
            age,
            statuses,
            using=options["database"],
            batch_size=options["batch_size"],
            pause=options["pause"],
            progress=self._progress if options["verbosity"] >= 2 else None,
        )
        self.stdout.write(
            f"Deleted {result.total:,} tasks in {result.batches} batches: "
            f"{self._by_status(result.deleted)}."
        )

    def _by_setting(self, options: dict[str, Any]) -> None:
        if options["dry_run"]:
            from ...retention import retention_setting

            ages = retention_setting()
            if not ages:
                self.stdout.write("RDBTASKS_RETENTION is not set: nothing would be deleted.")
            for status, age in ages.items():
                n = count_prunable(age, [status], using=options["database"])[status]
                self.stdout.write(f"Would delete {n:,} {status} tasks older than {age}.")
            return
        result = prune_by_setting(
            using=options["database"], time_budget=None, batch_size=options["batch_size"]
        )
        if result is None:
            raise CommandError("Another process is pruning right now; try again later.")
        self.stdout.write(
            f"Deleted {result.total:,} tasks ({self._by_status(result.deleted)}) "
            f"and {result.workers} rows of gone workers."
        )

    def _progress(self, result: PruneResult) -> None:
        self.stdout.write(f"  batch {result.batches}: {result.total:,} deleted so far")

    @staticmethod
    def _by_status(counts: dict[str, int]) -> str:
        parts = [f"{status} {n:,}" for status, n in sorted(counts.items()) if n]
        return ", ".join(parts) or "none"
