from __future__ import annotations

import logging
import sys
from importlib import import_module
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils.module_loading import autodiscover_modules

from ...states import ClaimMode
from ...worker import Supervisor, Worker


class Command(BaseCommand):
    help = "Run worker processes that claim and execute tasks from the database."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--processes", type=int, default=1, help="Worker processes (default 1)."
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

    def handle(self, *args: Any, **options: Any) -> None:
        self._setup_logging(options["log_level"])
        batch = options["batch"]
        if options["processes"] < 0 or options["threads"] < 1 or (batch is not None and batch < 1):
            raise CommandError("--threads and --batch must be at least 1, --processes at least 0.")
        if options["processes"] == 0 and options["no_scheduler"]:
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
            options["processes"], worker_options, scheduler=not options["no_scheduler"]
        )
        sys.exit(supervisor.run())

    def _setup_logging(self, level: str) -> None:
        logger = logging.getLogger("django_rdbtasks")
        logger.setLevel(level.upper())
        if not logger.handlers and not logging.getLogger().handlers:
            handler = logging.StreamHandler()
            handler.setFormatter(
                logging.Formatter("%(asctime)s %(levelname)s [%(process)d] %(message)s")
            )
            logger.addHandler(handler)
