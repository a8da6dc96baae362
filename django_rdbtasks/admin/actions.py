"""Operator actions, defined once and offered both as list actions and as buttons.

An ``Operation`` says what to do to one object and returns a word for what
happened ("requeued", "skipped"...); the same function serves the rows
selected in a list and the button on an object's page, so the two can never
disagree, and the messages count what each object's call said rather than
re-counting the rows afterwards (which, after a status change, finds none).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any, ClassVar

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db.models import Model
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.urls import path
from django.utils.translation import ngettext

from .utils import admin_url, not_found, post_only

if TYPE_CHECKING:
    from django_stubs_ext import StrOrPromise


@dataclass(frozen=True, slots=True)
class Report:
    """The message for objects that ended the same way; ``%(n)d`` is their number."""

    singular: str
    plural: str
    level: int = messages.SUCCESS

    def text(self, n: int) -> str:
        return ngettext(self.singular, self.plural, n) % {"n": n}


Perform = Callable[[Any, HttpRequest, Any], str]


@dataclass(frozen=True, slots=True)
class Operation:
    #: The URL segment of the button (``<id>/<name>/``) and the name of its URL.
    name: str
    #: The list action's name (what the action menu posts).
    action_name: str
    description: StrOrPromise
    #: ``ModelAdmin.has_<permission>_permission(request, obj)`` guards it.
    permission: str
    #: Does it to one object; returns a key of ``reports``.
    perform: Perform
    reports: Mapping[str, Report]
    #: Whether the object is in a state the button is offered for (the action
    #: takes any row, and its report says which were left alone).
    applies: Callable[[Any], bool] | None = None
    #: The columns ``perform`` reads; the rest of a selected row is not loaded.
    fields: Sequence[str] = ()
    as_action: bool = True
    as_button: bool = True
    #: Where the button leads afterwards: the changelist once the object is gone.
    leaves_object: bool = False

    def allowed(self, model_admin: Any, request: HttpRequest, obj: Any = None) -> bool:
        return bool(getattr(model_admin, f"has_{self.permission}_permission")(request, obj))

    def run(self, model_admin: Any, request: HttpRequest, objects: Iterable[Any]) -> Counter:
        tally = Counter(self.perform(model_admin, request, obj) for obj in objects)
        for outcome, report in self.reports.items():
            if tally[outcome]:
                model_admin.message_user(request, report.text(tally[outcome]), report.level)
        return tally

    def action(self) -> Callable[..., None]:
        def run_on_selection(model_admin: Any, request: HttpRequest, queryset: Any) -> None:
            rows = queryset.only(*self.fields) if self.fields else queryset
            self.run(model_admin, request, rows)

        run_on_selection.__name__ = self.action_name
        return admin.action(description=self.description, permissions=[self.permission])(
            run_on_selection
        )


class OperationsMixin:
    """Adds a ModelAdmin's ``operations`` as list actions and as POST-only button URLs."""

    operations: ClassVar[Sequence[Operation]] = ()

    def get_actions(self, request: HttpRequest, action_location: Any = None) -> dict[str, Any]:
        # Django 6.1 also asks for the actions of a change form (``action_location``);
        # there the operations are buttons of their own.
        if action_location is None:
            actions = super().get_actions(request)  # type: ignore[misc]
        else:
            actions = super().get_actions(request, action_location=action_location)  # type: ignore[misc]
            if getattr(action_location, "name", "") != "CHANGE_LIST":
                return actions
        for operation in self.operations:
            if operation.as_action and operation.allowed(self, request):
                func = operation.action()
                actions[operation.action_name] = (
                    func,
                    operation.action_name,
                    operation.description,
                )
        return actions

    def get_urls(self) -> list:
        wrap = self.admin_site.admin_view  # type: ignore[attr-defined]
        info = f"{self.opts.app_label}_{self.opts.model_name}"  # type: ignore[attr-defined]
        buttons = [
            path(
                f"<path:object_id>/{op.name}/",
                wrap(partial(self.operation_view, operation=op)),
                name=f"{info}_{op.name}",
            )
            for op in self.operations
            if op.as_button
        ]
        return [*buttons, *super().get_urls()]  # type: ignore[misc]

    def buttons_allowed(self, request: HttpRequest, obj: Model) -> dict[str, bool]:
        """``can_<name>`` for the change form's template: which buttons to show."""
        return {
            f"can_{op.name}": op.allowed(self, request, obj)
            and (op.applies is None or op.applies(obj))
            for op in self.operations
            if op.as_button
        }

    @post_only
    def operation_view(
        self, request: HttpRequest, object_id: str, operation: Operation
    ) -> HttpResponse:
        model = self.model  # type: ignore[attr-defined]
        obj = self.get_object(request, object_id)  # type: ignore[attr-defined]
        if obj is None:
            raise not_found(model, object_id)
        if not operation.allowed(self, request, obj):
            raise PermissionDenied
        operation.run(self, request, [obj])
        if operation.leaves_object:
            return HttpResponseRedirect(admin_url(model, "changelist"))
        return HttpResponseRedirect(admin_url(model, "change", obj.pk))
