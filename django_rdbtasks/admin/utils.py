"""Small helpers of the admin's own pages: URLs, the page context, the database clock."""

from __future__ import annotations

import datetime as dt
from typing import Any
from urllib.parse import urlencode

import django
from django.contrib import admin
from django.db.models import Model
from django.http import Http404, HttpRequest
from django.urls import reverse
from django.utils.decorators import method_decorator
from django.utils.translation import gettext_lazy as _
from django.views.decorators.http import require_POST

from ..jobs import database_now

#: The app's name in breadcrumbs: the app and its main model are both "Tasks",
#: and "Tasks > Tasks" reads like a mistake.
APP_CRUMB = _("Task queue")

#: Operator views change state: POST only, so that no link or prefetch can trigger one.
post_only = method_decorator(require_POST)


def admin_url(model: type[Model], view: str, *args: Any, query: dict | None = None) -> str:
    opts = model._meta
    url = reverse(f"admin:{opts.app_label}_{opts.model_name}_{view}", args=args)
    return f"{url}?{urlencode(query)}" if query else url


def request_now(request: HttpRequest, using: str) -> dt.datetime:
    """The database clock, read once per request: ages and durations of a page agree."""
    cache = request.__dict__.setdefault("_rdbtasks_now", {})
    if using not in cache:
        cache[using] = database_now(using)
    return cache[using]


def db_now(obj: Any) -> dt.datetime | None:
    """The database clock as read with the row (the admins' ``get_queryset`` annotate it)."""
    return getattr(obj, "db_now", None)


def page_context(
    model_admin: admin.ModelAdmin, request: HttpRequest, title: Any, crumbs: list
) -> dict[str, Any]:
    """The context of an admin page of our own: the site's, plus breadcrumbs."""
    request.current_app = model_admin.admin_site.name
    return {
        **model_admin.admin_site.each_context(request),
        "title": title,
        "opts": model_admin.opts,
        "crumbs": crumbs,
        "app_crumb": APP_CRUMB,
        # Django 6 marks breadcrumbs up as a list; 5.2 as a div.
        "ol_breadcrumbs": django.VERSION >= (6, 0),
    }


def not_found(model: type[Model], object_id: str) -> Http404:
    return Http404(f"No {model._meta.verbose_name} with id {object_id!r}.")
