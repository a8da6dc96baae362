from __future__ import annotations

import logging
from importlib import import_module
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DatabaseError, connections
from django.utils.module_loading import autodiscover_modules

from ...backend import RDBTaskBackend
from ...compat import task_backends
from ...observability.metrics import MetricsServer
from ...states import ClaimMode
from ...worker import Supervisor, Worker
from ...worker.autoscale import AutoscalePolicy, parse_range
from ...worker.connection import bound_user_connections


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
        parser.add_argument("--log-level", default="INFO", help="Log level (default INFO).")
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
        self._refuse_where_workers_cannot_share(options["backend"])
        self._setup_logging(options["log_level"])
        # Django 6.1's checks connect (the server version): bounded like the rest.
        bound_user_connections(options["lease"])
        self._check()
        batch = options["batch"]
        autoscale = self._autoscale(options)
        if options["processes"] is None:
            options["processes"] = 1
        if options["processes"] < 0 or options["threads"] < 1 or (batch is not None and batch < 1):
            raise CommandError("--threads and --batch must be at least 1, --processes at least 0.")
        if options["processes"] == 0 and autoscale is None and options["no_scheduler"]:
            raise CommandError("--processes 0 with --no-scheduler would run nothing.")
        if options["lease"] <= 0 or options["poll_interval"] <= 0:
            raise CommandError("--lease and --poll-interval must be positive.")
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
        # Tasks modules hold @task, @periodic and @record_processor declarations:
        # load them once, before the processes fork.
        autodiscover_modules("tasks")
        for module in getattr(settings, "RDBTASKS_IMPORTS", []):
            import_module(module)
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
        try:
            instance = task_backends[backend]
        except Exception:
            return  # an unknown backend is refused with the other options, below
        if not isinstance(instance, RDBTaskBackend):
            return  # likewise
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

    def _autoscale(self, options: dict[str, Any]) -> AutoscalePolicy | None:
        if options["autoscale"] is None:
            return None
        if options["processes"] is not None:
            raise CommandError(
                "--autoscale and --processes cannot be used together: "
                "--autoscale MIN:MAX sets the number of processes."
            )
        if options["burst"]:
            raise CommandError(
                "--autoscale cannot be used with --burst: a burst drains and exits, "
                "autoscaling follows a queue that keeps running."
            )
        if options["autoscale_interval"] <= 0 or options["autoscale_idle"] < 0:
            raise CommandError(
                "--autoscale-interval must be positive, --autoscale-idle not negative."
            )
        try:
            minimum, maximum = parse_range(options["autoscale"])
            return AutoscalePolicy(
                minimum,
                maximum,
                threads=max(1, options["threads"]),
                backlog_per_process=options["autoscale_backlog"],
                lag_threshold=options["autoscale_lag"],
                idle_after=options["autoscale_idle"],
            )
        except ValueError as exc:
            raise CommandError(str(exc)) from exc

    def _metrics(self, options: dict[str, Any]) -> MetricsServer | None:
        port = options["metrics_port"]
        if port is None:
            return None
        if not 0 <= port <= 65535:
            raise CommandError("--metrics-port must be between 0 and 65535.")
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
