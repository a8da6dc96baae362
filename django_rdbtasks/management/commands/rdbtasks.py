"""``manage.py rdbtasks status``: the queue at a glance, and a health check for monitors.

Exit codes (``status``): 0 healthy, 1 a health limit is exceeded, 2 the
database could not be asked. Limits come from ``RDBTASKS_HEALTH`` and the
``--max-*``/``--min-workers`` options, so a monitor can run::

    python manage.py rdbtasks status --max-lag 300 --min-workers 1 --quiet

``rdbtasks probe live`` and ``rdbtasks probe ready`` are the probes of one
worker host (a Kubernetes pod): see docs/deploy.md. ``rdbtasks
rebuild-indexes`` rebuilds the task table's indexes a held-back cleanup grew
(PostgreSQL; docs/admin.md).
"""

from __future__ import annotations

import datetime as dt
import getpass
import json
import math
import socket
import sys
import threading
from collections.abc import Callable, Sequence
from typing import Any

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DatabaseError, connections, router

from ... import index_rebuild, queues, snapshots
from ...cleanup import SHOWN_AFTER, CleanupReport, shown_tables
from ...conf import HEALTH_LIMITS
from ...durations import parse_age
from ...explain import explain
from ...locks import LeasedLock
from ...models import Task
from ...schema import unapplied_migrations
from ...states import TaskStatus
from ..text import counted, refuse

EXIT_UNHEALTHY = 1
EXIT_DATABASE = 2

#: ``probe live``: seconds without a heartbeat before a worker process counts as
#: stuck. Workers beat every ``--lease / 3`` (10 s by default).
DEFAULT_HEARTBEAT_WITHIN = 60.0
#: Seconds a probe gives the database to answer, below a probe's own timeout.
DEFAULT_PROBE_TIMEOUT = 5.0


def format_table(headers: Sequence[str], rows: Sequence[Sequence[Any]], right: set[int]) -> str:
    """A plain text table; columns in ``right`` are aligned right (numbers)."""
    cells = [[str(h) for h in headers], *[[str(c) for c in row] for row in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]

    def line(row: list[str]) -> str:
        return "  ".join(
            cell.rjust(widths[i]) if i in right else cell.ljust(widths[i])
            for i, cell in enumerate(row)
        ).rstrip()

    return "\n".join(line(row) for row in cells)


def seconds_text(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 60:
        return f"{seconds:.1f}s"
    if seconds < 3600:
        return f"{seconds / 60:.1f}min"  # the unit --window takes ("m" is refused there)
    return f"{seconds / 3600:.1f}h"


class Command(BaseCommand):
    help = (
        "Queue depth, lag and live workers (status), the worker registry (workers), "
        "this host's liveness and readiness (probe), why a task is not running "
        "(explain), or a queue paused and resumed (pause, resume)."
    )
    # No system checks first: some of them query the database (on Django 6.1),
    # so a probe would crash where it must answer, and a monitor runs often.
    requires_system_checks: list[str] = []

    def add_arguments(self, parser: CommandParser) -> None:
        subcommands = parser.add_subparsers(dest="subcommand", required=True)
        status = subcommands.add_parser(
            "status",
            help="Tasks per queue and status, lag, live workers; exit 1 when unhealthy.",
            description="Tasks per queue and status, lag, throughput and live workers. "
            "Exit code 0 when every configured health limit holds, 1 when one fails, "
            "2 when the database cannot be reached.",
        )
        self._common(status)
        self._read_from(status)
        status.add_argument(
            "--queue",
            action="append",
            dest="queues",
            metavar="NAME",
            help="Only this queue; repeat for more (default: all).",
        )
        status.add_argument("--json", action="store_true", help="Print JSON, for scripts.")
        status.add_argument(
            "--quiet", action="store_true", help="Print nothing; only the exit code tells."
        )
        status.add_argument(
            "--window",
            default="1h",
            help="How far back finished tasks are counted (default 1h; e.g. 15min, 24h, 7d).",
        )
        limits = status.add_argument_group(
            "health limits", "Override RDBTASKS_HEALTH; a limit not set is not checked."
        )
        limits.add_argument(
            "--max-lag", type=float, metavar="SECONDS", help=HEALTH_LIMITS["MAX_LAG"]
        )
        limits.add_argument(
            "--min-workers", type=int, metavar="N", help=HEALTH_LIMITS["MIN_WORKERS"]
        )
        limits.add_argument("--max-ready", type=int, metavar="N", help=HEALTH_LIMITS["MAX_READY"])
        limits.add_argument(
            "--max-stalled", type=int, metavar="N", help=HEALTH_LIMITS["MAX_STALLED"]
        )
        limits.add_argument("--max-failed", type=int, metavar="N", help=HEALTH_LIMITS["MAX_FAILED"])
        limits.add_argument(
            "--max-xmin-age",
            type=float,
            metavar="SECONDS",
            help=HEALTH_LIMITS["MAX_XMIN_AGE"],
        )

        probe = subcommands.add_parser(
            "probe",
            help="Liveness or readiness of this host's workers (exit 0 passes).",
            description="live: every worker process of this host that registered has "
            "heartbeated within --within seconds (passes when the database is unreachable: "
            "restarting cannot fix that). ready: the database answers and every migration "
            "is applied. Exit 0 passes, 1 fails, 2 (ready) the database is unreachable.",
        )
        probe.add_argument("kind", choices=["live", "ready"])
        self._common(probe)
        probe.add_argument(
            "--within",
            type=float,
            default=DEFAULT_HEARTBEAT_WITHIN,
            metavar="SECONDS",
            help=f"live: the oldest heartbeat that passes (default {DEFAULT_HEARTBEAT_WITHIN:g}).",
        )
        probe.add_argument(
            "--timeout",
            type=float,
            default=DEFAULT_PROBE_TIMEOUT,
            metavar="SECONDS",
            help="How long the database may take to answer before it counts as "
            f"unreachable (default {DEFAULT_PROBE_TIMEOUT:g}).",
        )

        explain_ = subcommands.add_parser(
            "explain",
            help="Why a task is not running: every condition the claim applies, for one task.",
        )
        explain_.add_argument("task_id", metavar="TASK_ID")
        self._common(explain_)
        explain_.add_argument("--json", action="store_true", help="Print JSON, for scripts.")
        for verb, what in (
            ("pause", "Stop every worker claiming from a queue (running tasks finish)."),
            ("resume", "Let workers claim from a paused queue again."),
        ):
            queue_command = subcommands.add_parser(verb, help=what, description=what)
            queue_command.add_argument("queue", metavar="QUEUE")
            self._common(queue_command)
            queue_command.add_argument(
                "--by", default="", help="Who does it, for the record (default: the OS user)."
            )
            if verb == "pause":
                queue_command.add_argument("--reason", default="", help="Why, for the record.")

        rebuild = subcommands.add_parser(
            "rebuild-indexes",
            help="PostgreSQL: rebuild the task table's indexes a held-back cleanup grew "
            "(REINDEX INDEX CONCURRENTLY), as the scheduler does after a pin.",
        )
        self._common(rebuild)
        rebuild.add_argument(
            "--dry-run", action="store_true", help="Only list the grown indexes and their sizes."
        )
        workers = subcommands.add_parser("workers", help="The worker registry.")
        self._common(workers)
        self._read_from(workers)
        workers.add_argument("--all", action="store_true", help="Also stopped and gone workers.")
        workers.add_argument("--json", action="store_true", help="Print JSON, for scripts.")

    def _common(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--database",
            default=None,
            help="The database alias holding the tasks (default: routed).",
        )

    def _read_from(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--primary",
            action="store_true",
            help="Read from the primary even when the backend has a READ_DATABASE (a replica, "
            "which may lag).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if options["subcommand"] == "probe":
            self.probe(options)
            return
        try:
            if options["subcommand"] == "status":
                self.status(options)
            elif options["subcommand"] == "explain":
                self.explain(options)
            elif options["subcommand"] in ("pause", "resume"):
                self.pause_or_resume(options)
            elif options["subcommand"] == "rebuild-indexes":
                self.rebuild_indexes(options)
            else:
                self.workers(options)
        except DatabaseError as exc:
            raise CommandError(
                f"cannot read the task tables: {exc}", returncode=EXIT_DATABASE
            ) from exc

    # -- rebuild-indexes ---------------------------------------------------------------

    def rebuild_indexes(self, options: dict[str, Any]) -> None:
        """The grown indexes, rebuilt one at a time (docs/admin.md, "What holds back cleanup")."""
        using = options["database"] or router.db_for_write(Task)
        if connections[using].vendor != "postgresql":
            raise CommandError("rebuild-indexes is PostgreSQL's: its indexes are what a pin grows")
        grown = index_rebuild.grown_indexes(using)
        if not grown:
            self.stdout.write("No index of the task table has grown past what its rows need.")
            return
        for name, size in grown:
            self.stdout.write(f"{name}: {size / 2**20:.1f} MB")
        if options["dry_run"]:
            return
        oldest = index_rebuild.oldest_transaction_seconds(using)
        if oldest > index_rebuild.QUIET_FOR:
            raise CommandError(
                f"a transaction open for {oldest:.0f} s holds back the cleanup: a rebuild would "
                "wait for it and keep what it keeps. End it first (rdbtasks status shows it)."
            )
        lock = LeasedLock("rdbtasks:rebuild-indexes", lease=60.0, using=using)
        if not lock.acquire():
            raise CommandError("a scheduler is rebuilding them now")
        lock.start_renewing()
        try:
            for name, size in grown:
                try:
                    index_rebuild.rebuild_index(using, name)
                except DatabaseError as exc:
                    index_rebuild.drop_leftovers(using)
                    raise CommandError(f"rebuilding {name} failed: {exc}") from exc
                self.stdout.write(f"rebuilt {name} ({size / 2**20:.1f} MB before)")
        finally:
            lock.stop_renewing()
            lock.release()

    # -- status ------------------------------------------------------------------------

    def status(self, options: dict[str, Any]) -> None:
        window, limits = self._status_arguments(options)
        using = options["database"] or snapshots.default_database()
        if options["queues"]:
            refuse(
                snapshots.unknown_queue_problems(
                    options["queues"],
                    Task.objects.using(using),
                    snapshots.configured_queues(using),
                )
            )
        snap = snapshots.snapshot(
            options["database"],
            window=window,
            queues=options["queues"],
            replica=not options["primary"],
            cleanup=True,
        )
        checks = snapshots.check_health(snap, limits)
        healthy = all(check.ok for check in checks)
        if options["json"]:
            data = snap.as_dict()
            data["health"] = {
                "ok": healthy,
                "checks": [
                    {"name": c.name, "value": c.value, "limit": c.limit, "ok": c.ok} for c in checks
                ],
            }
            self.stdout.write(json.dumps(data, indent=2))
        elif not options["quiet"]:
            self.stdout.write(self._status_text(snap, checks))
        if not healthy:
            # Like `makemigrations --check`: the output says why, the code says that.
            sys.exit(EXIT_UNHEALTHY)

    @staticmethod
    def _status_arguments(options: dict[str, Any]) -> tuple[dt.timedelta, dict[str, float]]:
        """The window and the health limits, or every problem with them in one refusal."""
        problems = []
        window = dt.timedelta(hours=1)
        try:
            window = parse_age(options["window"])
        except ValueError as exc:
            problems.append(f"--window: {exc}")
        limits: dict[str, float] = {}
        try:
            limits = snapshots.health_limits(
                max_lag=options["max_lag"],
                min_workers=options["min_workers"],
                max_ready=options["max_ready"],
                max_stalled=options["max_stalled"],
                max_failed=options["max_failed"],
                max_xmin_age=options["max_xmin_age"],
            )
        except ValueError as exc:
            problems.append(str(exc))
        for name, value in limits.items():
            if not 0 <= value < math.inf:  # NaN too
                flag = "--" + name.lower().replace("_", "-")
                problems.append(f"{flag} (or RDBTASKS_HEALTH[{name!r}]) must be 0 or more.")
        refuse(problems)
        return window, limits

    def _status_text(self, snap: snapshots.Snapshot, checks: list[snapshots.HealthCheck]) -> str:
        window = seconds_text(snap.window.total_seconds())
        rows = [
            self._queue_row(name, stats, snap)
            for name, stats in [*snap.queues.items(), ("TOTAL", snap.total)]
        ]
        headers = [
            "QUEUE",
            TaskStatus.READY.value,
            "SCHEDULED",
            TaskStatus.WAITING.value,
            TaskStatus.RUNNING.value,
            "STALLED",
            "LAG",
            f"OK/{window}",
            f"{TaskStatus.FAILED.value}/{window}",
            f"{TaskStatus.CANCELLED.value}/{window}",
        ]
        about = "about " if snap.rows.estimate else ""
        lines = [
            f"Tasks in {snap.using} ({snap.vendor}) at {snap.now:%Y-%m-%d %H:%M:%S} UTC "
            f"(database clock); {about}{snap.rows.value:,} rows in the table.",
            "",
            format_table(headers, rows, right=set(range(1, len(headers)))),
            "",
            self._workers_line(snap),
        ]
        if snap.off_primary:
            behind = "unknown" if snap.replica_lag is None else seconds_text(snap.replica_lag)
            lines.insert(1, f"Read from {snap.read_from}, a replica; replication lag: {behind}.")
        if snap.cleanup is not None and snap.cleanup.supported:
            lines += ["", cleanup_text(snap.cleanup)]
        if checks:
            lines += ["", "Health: " + ("OK" if all(c.ok for c in checks) else "UNHEALTHY")]
            lines += [f"  {check.describe()}" for check in checks]
        return "\n".join(lines)

    def _queue_row(
        self, name: str, stats: snapshots.QueueStats, snap: snapshots.Snapshot
    ) -> list[Any]:
        if stats.paused_since is not None:
            paused_for = seconds_text((snap.now - stats.paused_since).total_seconds())
            name = f"{name} (paused {paused_for})"
        return [
            name,
            stats.ready,
            stats.scheduled,
            stats.waiting,
            stats.running,
            stats.stalled,
            seconds_text(stats.lag(snap.now)),
            stats.succeeded,
            stats.failed,
            stats.cancelled,
        ]

    def _workers_line(self, snap: snapshots.Snapshot) -> str:
        running = sum(worker.running for worker in snap.workers)
        text = f"Workers: {len(snap.workers)} alive, running {counted(running, 'task')}"
        if snap.gone_workers:
            text += f"; {snap.gone_workers} gone without stopping (no heartbeat)"
        return text + "."

    # -- explain, pause, resume ----------------------------------------------------------

    def explain(self, options: dict[str, Any]) -> None:
        try:
            why = explain(options["task_id"], using=options["database"])
        except (Task.DoesNotExist, ValidationError, ValueError):
            raise CommandError(f"No task {options['task_id']!r}.") from None
        if options["json"]:
            self.stdout.write(json.dumps(why.as_json(), indent=2))
        else:
            self.stdout.write(str(why))

    def pause_or_resume(self, options: dict[str, Any]) -> None:
        queue, verb = options["queue"], options["subcommand"]
        by = options["by"] or getpass.getuser()
        try:
            if verb == "pause":
                changed = queues.pause(
                    queue, by=by, reason=options["reason"], using=options["database"]
                )
            else:
                changed = queues.resume(queue, by=by, using=options["database"])
        except queues.UnknownQueue as exc:
            raise CommandError(str(exc)) from exc
        if verb == "pause":
            self.stdout.write(
                f"Queue {queue!r} paused." if changed else f"Queue {queue!r} was paused already."
            )
        else:
            self.stdout.write(
                f"Queue {queue!r} resumed." if changed else f"Queue {queue!r} was not paused."
            )

    # -- probes ------------------------------------------------------------------------

    def probe(self, options: dict[str, Any]) -> None:
        refuse(
            [
                f"--{name} must be a positive number of seconds, not {options[name]}."
                for name in ("within", "timeout")
                if not 0 < options[name] < math.inf
            ]
        )
        using = options["database"] or snapshots.default_database()
        if options["kind"] == "live":
            self._probe_live(using, options["within"], options["timeout"])
        else:
            self._probe_ready(using, options["timeout"])

    def _probe_live(self, using: str, within: float, timeout: float) -> None:
        from ...worker.registry import local_workers

        host = socket.gethostname()
        try:
            workers = _bounded(lambda: local_workers(using), timeout)
        except (DatabaseError, TimeoutError) as exc:
            # Every worker is cut off alike, and reconnects by itself once the
            # database is back; restarting them all would only add a storm of
            # restarts. Readiness reports the outage instead.
            self.stdout.write(f"live: passing, the database is unreachable ({_one_line(exc)})")
            return
        if not workers:
            self._fail(f"live: no running worker process of {host} is registered")
        stuck = [w for w in workers if w.heartbeat_age > within]
        if stuck:
            self._fail(
                f"live: no heartbeat within {within:g}s from "
                + ", ".join(f"{w.name} ({w.heartbeat_age:.0f}s ago)" for w in stuck)
            )
        oldest = max(w.heartbeat_age for w in workers)
        processes = "1 worker process" if len(workers) == 1 else f"{len(workers)} worker processes"
        self.stdout.write(f"live: {processes} of {host}, oldest heartbeat {oldest:.1f}s ago")

    def _probe_ready(self, using: str, timeout: float) -> None:
        try:
            unapplied = _bounded(lambda: unapplied_migrations(using), timeout)
        except (DatabaseError, TimeoutError) as exc:
            self._fail(f"ready: the database is unreachable ({_one_line(exc)})", code=EXIT_DATABASE)
        if unapplied:
            shown = ", ".join(unapplied[:5]) + (" ..." if len(unapplied) > 5 else "")
            self._fail(f"ready: {len(unapplied)} migrations not applied: {shown}")
        self.stdout.write("ready: the database answers and every migration is applied")

    def _fail(self, message: str, *, code: int = EXIT_UNHEALTHY) -> Any:
        self.stdout.write(message)
        self.stdout.flush()
        sys.exit(code)

    # -- workers -----------------------------------------------------------------------

    def workers(self, options: dict[str, Any]) -> None:
        using = options["database"] or snapshots.default_database()
        from ...jobs import database_now
        from ...models import Worker
        from ...reads import read_database

        if not options["primary"]:
            using = read_database(using)

        now = database_now(using)
        rows = Worker.objects.using(using).order_by("-last_heartbeat_at")
        if not options["all"]:
            rows = rows.alive(snapshots.ALIVE_WITHIN)
        workers = [snapshots.worker_as_dict(worker, now) for worker in rows[:500]]
        if options["json"]:
            self.stdout.write(json.dumps(workers, indent=2))
            return
        if not workers:
            self.stdout.write("No live worker." if not options["all"] else "No worker.")
            return
        headers = [
            "NAME",
            "STATE",
            "QUEUES",
            "MODE",
            "THREADS",
            "BATCH",
            TaskStatus.RUNNING.value,
            "DONE",
            TaskStatus.FAILED.value,
        ]
        table = [
            [
                w["name"],
                w["state"],
                ",".join(w["queues"]),
                w["mode"],
                w["threads"],
                # The admin's word for no --batch (the registry stores 0, JSON null).
                w["batch"] or "adaptive",
                w["running"],
                w["done"],
                w["failed"],
            ]
            for w in workers
        ]
        table_rows = [
            [*row, seconds_text(w["heartbeat_age_seconds"]) + " ago"]
            for row, w in zip(table, workers, strict=True)
        ]
        self.stdout.write(format_table([*headers, "HEARTBEAT"], table_rows, right={4, 5, 6, 7, 8}))


def cleanup_text(report: CleanupReport) -> str:
    """What holds back the cleanup of the tables: the oldest holders, the dead rows."""
    if report.oldest_age is None:
        headline = "Cleanup: no transaction open"
    else:
        headline = f"Cleanup: the oldest open transaction is {seconds_text(report.oldest_age)} old"
    if report.oldest_xid_age is not None:
        headline += f" ({report.oldest_xid_age:,} transactions behind at most)"
    if report.history_length is not None:
        headline += f"; InnoDB history list length {report.history_length:,}"
    lines = [headline + "."]
    if report.holders:
        lines += [
            f"Holding back the cleanup (open for {SHOWN_AFTER:g}s or more; "
            "docs/admin.md says what to do):",
            format_table(
                ["HOLDER", "AGE", "XID AGE", "STATE", "APPLICATION", "CLIENT", "USER", "QUERY"],
                [
                    [
                        f"{holder.kind} {holder.name}",
                        seconds_text(holder.age),
                        "-" if holder.xid_age is None else f"{holder.xid_age:,}",
                        holder.state or "-",
                        holder.application or "-",
                        holder.client or "-",
                        holder.user or "-",
                        " ".join(holder.query.split())[:60] or "-",
                    ]
                    for holder in report.holders
                ],
                right={1, 2},
            ),
        ]
    tables = shown_tables(report)
    if tables:
        lines.append(
            format_table(
                ["TABLE", "LIVE ROWS", "DEAD ROWS", "LAST VACUUM", "LAST AUTOVACUUM"],
                [
                    [
                        t.table,
                        f"{t.live_rows:,}",
                        f"{t.dead_rows:,}",
                        _ago(report, t.last_vacuum),
                        _ago(report, t.last_autovacuum),
                    ]
                    for t in tables
                ],
                right={1, 2},
            )
        )
    lines += [f"Note: {note}" for note in [*report.notes, *report.problems]]
    return "\n".join(lines)


def _ago(report: CleanupReport, moment: Any) -> str:
    if moment is None or report.now is None:
        return "never"
    return seconds_text(max(0.0, (report.now - moment).total_seconds())) + " ago"


def _bounded(work: Callable[[], Any], timeout: float) -> Any:
    """``work()``, or ``TimeoutError`` after ``timeout`` seconds.

    A probe must answer before its own deadline: a database host that drops
    packets would hold a connect for minutes, and a probe the kubelet times out
    counts as failed, which for liveness would restart healthy workers. The
    work runs on a daemon thread (on its own connection), left behind if late.
    """
    answer: dict[str, Any] = {}

    def run() -> None:
        try:
            answer["value"] = work()
        except BaseException as exc:
            answer["error"] = exc
        finally:
            connections.close_all()

    thread = threading.Thread(target=run, name="rdbtasks-probe", daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        raise TimeoutError(f"no answer within {timeout:g}s")
    if "error" in answer:
        raise answer["error"]
    return answer["value"]


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text[:200]
