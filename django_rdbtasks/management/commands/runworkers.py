from __future__ import annotations

import logging
import math
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DatabaseError, connections

from ...backend import RDBTaskBackend
from ...compat import task_backends
from ...discovery import import_task_modules
from ...observability.metrics import MetricsServer
from ...states import ClaimMode
from ...suggest import did_you_mean
from ...worker import Supervisor, Worker
from ...worker.autoscale import AutoscalePolicy, parse_range
from ...worker.connection import bound_user_connections
from ..text import refuse

#: What --log-level takes: the levels of the logging module, by name.
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def _autoscale_problems(options: dict[str, Any]) -> list[str]:
    problems = []
    if options["processes"] is not None:
        problems.append(
            "--autoscale and --processes cannot be used together: "
            "--autoscale MIN:MAX sets the number of processes."
        )
    if options["burst"]:
        problems.append(
            "--autoscale cannot be used with --burst: a burst drains and exits, "
            "autoscaling follows a queue that keeps running."
        )
    if not (0 < options["autoscale_interval"] < math.inf):
        problems.append("--autoscale-interval must be a positive number of seconds.")
    if not (0 <= options["autoscale_idle"] < math.inf):
        problems.append("--autoscale-idle must be 0 or more seconds.")
    if not (0 <= options["autoscale_lag"] < math.inf):
        problems.append("--autoscale-lag must be 0 or more seconds.")
    if options["autoscale_backlog"] < 1:
        problems.append("--autoscale-backlog must be at least 1.")
    try:
        parse_range(options["autoscale"])
    except ValueError as exc:
        problems.append(str(exc))
    return problems


def _backend_problems(alias: str, queues: list[str]) -> list[str]:
    """--backend names an RDBTaskBackend of TASKS, and each --queue one of its QUEUES."""
    aliases = list(getattr(settings, "TASKS", {}) or {"default": None})
    if alias not in aliases:
        return [
            f"--backend {alias!r} is not in TASKS ({', '.join(aliases)})."
            + did_you_mean(alias, aliases)
        ]
    try:
        backend = task_backends[alias]
    except Exception as exc:  # the framework's InvalidTaskBackend: an unimportable BACKEND
        return [f"TASKS[{alias!r}]: {exc}"]
    if not isinstance(backend, RDBTaskBackend):
        return [f"Task backend {alias!r} is {type(backend).__name__}, not RDBTaskBackend."]
    return [
        f"--queue {name!r} is not in TASKS[{alias!r}]['QUEUES'] "
        f"({', '.join(sorted(backend.queues))})." + did_you_mean(name, backend.queues)
        for name in dict.fromkeys(queues)
        if backend.queues and name not in backend.queues
    ]


class Command(BaseCommand):
    help = "Run worker processes that claim and execute tasks from the database."
    # The system checks run in handle() instead: some ask the database (Django
    # 6.1's GeneratedField check reads the server's version), and a worker
    # started during an outage must wait for the database, not crash.
    requires_system_checks: list[str] = []

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--processes", type=int, default=None, help="Worker processes (default 1)."
        )
        parser.add_argument(
            "--threads", type=int, default=1, help="Tasks run at once per process (default 1)."
        )
        parser.add_argument(
            "--queue",
            action="append",
            dest="queues",
            metavar="NAME",
            help="A queue to serve; repeat for more (default: all the backend's QUEUES).",
        )
        parser.add_argument(
            "--mode",
            choices=[mode.value for mode in ClaimMode],
            default=ClaimMode.OPTIMISTIC.value,
            help="Claim by version compare-and-set (default) or SELECT ... FOR UPDATE SKIP LOCKED.",
        )
        parser.add_argument(
            "--batch",
            type=int,
            default=None,
            help="Tasks claimed per round trip by each thread (default: adaptive, from 1 up to "
            "100 while tasks are short; tasks waiting behind a long one are handed back).",
        )
        parser.add_argument(
            "--lease",
            type=float,
            default=30.0,
            help="Seconds a claim lasts without a heartbeat (default 30; renewed every third).",
        )
        parser.add_argument(
            "--poll-interval",
            type=float,
            default=1.0,
            help="Seconds between polls when idle (default 1; PostgreSQL also wakes on NOTIFY).",
        )
        parser.add_argument("--burst", action="store_true", help="Exit 0 once nothing is runnable.")
        parser.add_argument(
            "--max-tasks",
            type=int,
            default=None,
            help="Replace a worker process after it has run this many tasks.",
        )
        parser.add_argument(
            "--grace",
            type=float,
            default=30.0,
            help="Seconds running tasks get to finish after SIGTERM/SIGINT (default 30).",
        )
        parser.add_argument(
            "--backend", default="default", help="The TASKS alias to serve (default 'default')."
        )
        parser.add_argument(
            "--no-listen", action="store_true", help="Poll only; do not LISTEN on PostgreSQL."
        )
        parser.add_argument(
            "--no-scheduler",
            action="store_true",
            help="Do not fire cron Jobs from this host (by default every host may take part).",
        )
        parser.add_argument(
            "--no-processors",
            action="store_true",
            help="Do not run the registered record processors in these workers.",
        )
        parser.add_argument(
            "--log-level",
            default="INFO",
            type=str.upper,
            choices=LOG_LEVELS,
            help="The level of the workers' records (logger django_rdbtasks). Each task "
            "is one record: INFO, or ERROR with its traceback when it fails for good; the "
            "framework's own records of it (django.tasks) are not written. Default INFO: "
            "a line per task; WARNING: failures and problems only. See docs/observability.md.",
        )
        metrics = parser.add_argument_group("metrics (the 'metrics' extra: prometheus-client)")
        metrics.add_argument(
            "--metrics-port",
            type=int,
            default=None,
            metavar="PORT",
            help="Serve Prometheus metrics of every process of this command on PORT "
            "(0: any free port, logged).",
        )
        metrics.add_argument(
            "--metrics-address",
            default="127.0.0.1",
            metavar="ADDR",
            help="Address the metrics server binds (default 127.0.0.1; 0.0.0.0 for every one).",
        )
        scaling = parser.add_argument_group("autoscaling (instead of --processes)")
        scaling.add_argument(
            "--autoscale",
            metavar="MIN:MAX",
            default=None,
            help="Between MIN and MAX worker processes, as the backlog asks "
            "(see docs/observability.md).",
        )
        scaling.add_argument(
            "--autoscale-interval",
            type=float,
            default=5.0,
            metavar="SECONDS",
            help="Seconds between two readings of the backlog (default 5).",
        )
        scaling.add_argument(
            "--autoscale-idle",
            type=float,
            default=60.0,
            metavar="SECONDS",
            help="Seconds without backlog before one process is stopped (default 60).",
        )
        scaling.add_argument(
            "--autoscale-backlog",
            type=int,
            default=100,
            metavar="N",
            help="Grow when more than N runnable tasks per process wait unclaimed (default 100).",
        )
        scaling.add_argument(
            "--autoscale-lag",
            type=float,
            default=5.0,
            metavar="SECONDS",
            help="Grow when the oldest runnable task has waited this long (default 5).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        # Every problem of the arguments first, all at once: nothing is set
        # up, connected to or started before a refusal.
        refuse(self._argument_problems(options))
        self._refuse_where_workers_cannot_share(options["backend"])
        autoscale = self._autoscale(options)
        if options["processes"] is None:
            options["processes"] = 1
        worker_options = {
            "backend": options["backend"],
            "queues": options["queues"],
            "mode": options["mode"],
            "batch": options["batch"],
            "threads": options["threads"],
            "lease": options["lease"],
            "poll_interval": options["poll_interval"],
            "burst": options["burst"],
            "max_tasks": options["max_tasks"],
            "grace": options["grace"],
            "listen": not options["no_listen"],
            "processors": not options["no_processors"],
        }
        try:
            Worker(**worker_options)  # refuse bad options before any process starts
        except (ValueError, KeyError, ImproperlyConfigured) as exc:
            raise CommandError(str(exc)) from exc
        self._setup_logging(options["log_level"])
        # Django 6.1's checks connect (the server version): bounded like the rest.
        bound_user_connections(options["lease"])
        # The checks import the tasks modules as the workers will, and report
        # what they declare wrong (and a module that fails to import) together.
        self._check()
        # Tasks modules hold @task, @periodic and @record_processor declarations:
        # loaded once, before the processes fork (discovery.py).
        import_task_modules()
        supervisor = Supervisor(
            options["processes"],
            worker_options,
            scheduler=not options["no_scheduler"],
            autoscale=autoscale,
            autoscale_interval=options["autoscale_interval"],
            metrics=self._metrics(options),
        )
        code = supervisor.run()
        if code:
            # Through CommandError: manage.py exits with the code, call_command() raises.
            raise CommandError(f"the workers stopped with exit code {code}", returncode=code)

    def _refuse_where_workers_cannot_share(self, backend: str) -> None:
        """Refuse, before anything runs, a database the worker processes would not see.

        Workers are processes of their own, each with its own connection: they
        see only what is committed to a database they can open. An in-memory
        SQLite database is a different, empty database in every connection (a
        worker's effects would vanish while its log says they succeeded), and
        what a test's open transaction wrote is invisible to them until it
        commits. ``django_rdbtasks.testing.drain`` runs tasks in-process, in
        that transaction, instead (docs/testing.md).
        """
        instance = task_backends[backend]  # known: _argument_problems checked it
        if not isinstance(instance, RDBTaskBackend):
            return  # refused with the other options (Worker)
        database = instance.database
        connection: Any = connections[database]
        if connection.vendor == "sqlite" and connection.is_in_memory_db():
            raise CommandError(
                f"runworkers cannot run on the in-memory SQLite database of {database!r}: "
                "each worker process would open an empty database of its own, and the "
                "tasks' effects would vanish. Use a database file, or run tasks in-process "
                "with django_rdbtasks.testing.drain() (docs/testing.md)."
            )
        if connection.in_atomic_block:
            raise CommandError(
                f"runworkers was called inside an open transaction on {database!r} (a "
                "TestCase?): worker processes cannot see what it wrote until it commits. "
                "In a TestCase, run tasks in-process with django_rdbtasks.testing.drain(); "
                "a real worker needs a TransactionTestCase (docs/testing.md)."
            )

    @staticmethod
    def _argument_problems(options: dict[str, Any]) -> list[str]:
        """What is wrong with the arguments, one sentence each (nothing: they are fine)."""
        problems = []

        def at_least(flag: str, minimum: float, *, unit: str = "") -> None:
            value = options[flag.lstrip("-").replace("-", "_")]
            # NaN fails every comparison, inf is no duration: neither passes.
            if value is not None and not (minimum <= value < math.inf):
                problems.append(f"{flag} must be at least {minimum:g}{unit}, not {value}.")

        def positive(flag: str) -> None:
            value = options[flag.lstrip("-").replace("-", "_")]
            if not (0 < value < math.inf):
                problems.append(f"{flag} must be a positive number of seconds, not {value}.")

        at_least("--processes", 0)
        at_least("--threads", 1)
        at_least("--batch", 1)
        # 0 would replace every process before it ran a task, forever.
        at_least("--max-tasks", 1)
        at_least("--grace", 0, unit=" seconds")
        positive("--lease")
        positive("--poll-interval")
        if options["processes"] == 0 and options["autoscale"] is None and options["no_scheduler"]:
            problems.append("--processes 0 with --no-scheduler would run nothing.")
        port = options["metrics_port"]
        if port is not None and not 0 <= port <= 65535:
            problems.append(f"--metrics-port must be between 0 and 65535, not {port}.")
        if options["autoscale"] is not None:
            problems += _autoscale_problems(options)
        problems += _backend_problems(options["backend"], options["queues"] or [])
        return problems

    def _autoscale(self, options: dict[str, Any]) -> AutoscalePolicy | None:
        if options["autoscale"] is None:
            return None
        minimum, maximum = parse_range(options["autoscale"])  # checked by _autoscale_problems
        return AutoscalePolicy(
            minimum,
            maximum,
            threads=max(1, options["threads"]),
            backlog_per_process=options["autoscale_backlog"],
            lag_threshold=options["autoscale_lag"],
            idle_after=options["autoscale_idle"],
        )

    def _metrics(self, options: dict[str, Any]) -> MetricsServer | None:
        port = options["metrics_port"]
        if port is None:
            return None
        try:
            import prometheus_client  # noqa: F401
        except ImportError:
            raise CommandError(
                "--metrics-port needs prometheus-client: pip install 'django-rdbtasks[metrics]'."
            ) from None
        server = MetricsServer(port, options["metrics_address"])
        # Before any process is forked: every child inherits the metrics and the directory.
        server.prepare()
        try:
            server.start()
        except OSError as exc:
            server.close()
            raise CommandError(
                f"cannot serve metrics on {options['metrics_address']}:{port} ({exc})."
            ) from exc
        return server

    def _check(self) -> None:
        """The system checks, as ``manage.py check`` runs them, unless the database is away."""
        try:
            self.check()
        except DatabaseError as exc:
            logging.getLogger("django_rdbtasks.worker").warning(
                "system checks skipped: they need the database, which does not answer (%s); "
                "starting anyway, the workers wait for it",
                exc,
            )

    def _setup_logging(self, level: str) -> None:
        logger = logging.getLogger("django_rdbtasks")
        logger.setLevel(level.upper())
        if not logger.handlers and not logging.getLogger().handlers:
            handler = logging.StreamHandler()
            handler.setFormatter(
                logging.Formatter("%(asctime)s %(levelname)s [%(process)d] %(message)s")
            )
            logger.addHandler(handler)
