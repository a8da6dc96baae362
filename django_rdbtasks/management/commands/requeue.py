"""``manage.py requeue``: run failed tasks again, by id, task, queue or time range."""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db.models import QuerySet

from ... import ops
from ...jobs import database_now
from ...models import Task, TaskStatus
from ...retention import parse_age


class Command(BaseCommand):
    help = (
        f"Requeue failed (or cancelled) tasks: {TaskStatus.READY.value} now, with fresh "
        "attempts; their history is kept. Select them by id, task, queue and when they finished."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("ids", nargs="*", metavar="TASK_ID", help="Task ids to requeue.")
        parser.add_argument(
            "--task",
            action="append",
            dest="tasks",
            metavar="PATH",
            help="Only this task path (myapp.tasks.send_invoice); repeatable.",
        )
        parser.add_argument(
            "--queue",
            action="append",
            dest="queues",
            metavar="NAME",
            help="Only this queue; repeatable.",
        )
        parser.add_argument(
            "--since",
            metavar="WHEN",
            help="Finished at or after: an age (2h, 3d) or an ISO 8601 time.",
        )
        parser.add_argument(
            "--until", metavar="WHEN", help="Finished before: an age (30m) or an ISO 8601 time."
        )
        parser.add_argument(
            "--status",
            action="append",
            dest="statuses",
            type=str.upper,
            choices=[TaskStatus.FAILED.value, TaskStatus.CANCELLED.value],
            help=f"{TaskStatus.FAILED.value} (the default) or {TaskStatus.CANCELLED.value}; "
            "repeat for both.",
        )
        parser.add_argument(
            "--all",
            action="store_true",
            help="Requeue every matching task even with no other filter.",
        )
        parser.add_argument("--limit", type=int, help="Requeue at most this many.")
        parser.add_argument(
            "--dry-run", action="store_true", help="Count the matching tasks; change nothing."
        )
        parser.add_argument("--database", default=None, help="The database alias of the tasks.")
        parser.add_argument(
            "--user",
            metavar="USERNAME",
            help="Act as this user: only the queues RDBTASKS_QUEUE_PERMISSIONS gives them, "
            "and only with the permission to retry tasks. Logged in the admin log as theirs.",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        selected = self.select(options)
        user = self._user(options["user"]) if options["user"] else None
        if user is not None:
            from ...admin.permissions import access_for

            selected = access_for(user).filter(selected)
        if options["dry_run"]:
            count = ops.capped_count(selected)
            about = "more than " if count.estimate else ""
            self.stdout.write(f"Would requeue {about}{count.value:,} tasks.")
            return
        on_batch = None
        if user is not None:
            from django.contrib.admin.models import CHANGE, LogEntry

            def on_batch(batch: list[ops.Requeued]) -> None:
                for item in batch:
                    LogEntry.objects.log_actions(
                        user.pk,
                        [Task(pk=item.id, task_path=item.task_path)],
                        CHANGE,
                        f"Requeued (was {item.was}) with manage.py requeue.",
                    )

        requeued = ops.requeue_tasks(selected, limit=options["limit"], on_batch=on_batch)
        self.stdout.write(f"Requeued {requeued:,} tasks.")

    @staticmethod
    def _user(username: str) -> Any:
        from django.contrib.auth import get_user_model

        model = get_user_model()
        try:
            user = model._default_manager.get_by_natural_key(username)
        except model.DoesNotExist as exc:
            raise CommandError(f"No user {username!r}.") from exc
        if not user.is_active or not user.has_perm("django_rdbtasks.retry_task"):
            raise CommandError(f"{username!r} may not retry tasks (django_rdbtasks.retry_task).")
        return user

    def select(self, options: dict[str, Any]) -> QuerySet[Task]:
        using = options["database"] or ops.default_database()
        has_filter = any(options[k] for k in ("ids", "tasks", "queues", "since", "until"))
        if not has_filter and not options["all"]:
            raise CommandError(
                "Say which tasks: ids, --task, --queue, --since/--until, or --all for every one."
            )
        statuses = options["statuses"] or [TaskStatus.FAILED]
        tasks = Task.objects.using(using).filter(status__in=statuses)
        if options["ids"]:
            tasks = tasks.filter(pk__in=[self._uuid(value) for value in options["ids"]])
        if options["tasks"]:
            tasks = tasks.filter(task_path__in=options["tasks"])
        if options["queues"]:
            tasks = tasks.filter(queue_name__in=options["queues"])
        if options["since"] or options["until"]:
            now = database_now(using)
            if options["since"]:
                tasks = tasks.filter(finished_at__gte=self._when(options["since"], now))
            if options["until"]:
                tasks = tasks.filter(finished_at__lt=self._when(options["until"], now))
        return tasks

    @staticmethod
    def _uuid(value: str) -> uuid.UUID:
        try:
            return uuid.UUID(value)
        except ValueError as exc:
            raise CommandError(f"{value!r} is not a task id.") from exc

    @staticmethod
    def _when(value: str, now: dt.datetime) -> dt.datetime:
        """An age back from the database clock, or an ISO 8601 time (UTC if it names none)."""
        try:
            return now - parse_age(value)
        except ValueError:
            pass
        try:
            moment = dt.datetime.fromisoformat(value)
        except ValueError as exc:
            raise CommandError(
                f"{value!r} is neither an age (2h, 3d) nor an ISO 8601 time."
            ) from exc
        return moment if moment.tzinfo else moment.replace(tzinfo=dt.UTC)
