"""The limits page: per concurrency or rate key, the slots in use and the tasks waiting."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.urls import path
from django.utils.translation import gettext_lazy as _

from .. import snapshots
from ..limit_usage import key_usage
from ..reads import read_database
from .display import duration_text
from .permissions import access_for
from .utils import page_context


class LimitSlotAdmin(admin.ModelAdmin):
    """Read only: a key's slots are the claim's to take and free, never an operator's.

    Shown to users who see every queue: a key is not of one queue.
    """

    def has_module_permission(self, request: HttpRequest) -> bool:
        return self.has_view_permission(request)

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return bool(
            request.user.has_perm("django_rdbtasks.view_task")
            and access_for(request.user).unrestricted
        )

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def get_urls(self) -> list:
        info = f"{self.opts.app_label}_{self.opts.model_name}"
        view = self.admin_site.admin_view(self.changelist_view)
        return [path("", view, name=f"{info}_changelist")]

    def changelist_view(self, request: HttpRequest, extra_context: Any = None) -> HttpResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        # A page: read where the other pages read (the replica, if there is one).
        using = read_database(snapshots.default_database())
        rows = [
            {"usage": usage, "window": duration_text(usage.period) if usage.period else ""}
            for usage in key_usage(using)
        ]
        context = {
            **page_context(self, request, _("Limits"), [("", _("Limits"))]),
            "rows": rows,
        }
        return TemplateResponse(request, "django_rdbtasks/admin/limits.html", context)
