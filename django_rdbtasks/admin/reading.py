"""Which database an admin request reads: the replica for pages, the primary for changes.

A request that only shows (GET, HEAD) reads the project's rows from the task
backend's ``READ_DATABASE`` (``reads.py``). Every change in this admin is a
POST (actions, the buttons of a task or job, a form's save, a delete), and a
POST reads on the primary: the rows an action changes, the object a form
saves (Django saves an object to the database it was read from) and the
object a button acts on are all read where the write goes. ``response_action``
re-selects an action's rows on the primary even so, whatever the request.

Without ``READ_DATABASE`` every request reads where it did before.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.contrib import admin
from django.db import router
from django.db.models import Model, QuerySet
from django.http import HttpRequest

from ..reads import read_database

#: The methods of a request that only reads.
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


def admin_database(request: HttpRequest, model: type[Model]) -> str:
    """The alias ``request`` reads ``model``'s rows from."""
    primary = router.db_for_write(model)
    if request.method not in SAFE_METHODS:
        return primary
    replica = read_database(primary)
    return replica if replica != primary else router.db_for_read(model)


if TYPE_CHECKING:
    _ModelAdminBase = admin.ModelAdmin
else:
    _ModelAdminBase = object


class ReadsOffPrimaryMixin(_ModelAdminBase):
    """A ModelAdmin whose pages read off the primary and whose changes never do."""

    def get_queryset(self, request: HttpRequest) -> QuerySet:
        return super().get_queryset(request).using(admin_database(request, self.model))

    def response_action(
        self, request: HttpRequest, queryset: QuerySet, *args: Any, **kwargs: Any
    ) -> Any:
        # The selected rows, re-read where the action writes (Django 6.1 adds
        # ``action_location``).
        primary = router.db_for_write(self.model)
        return super().response_action(request, queryset.using(primary), *args, **kwargs)
