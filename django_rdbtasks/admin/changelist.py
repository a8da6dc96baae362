"""A changelist that never counts the table: "previous / next" paging for millions of rows."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import django
from django.contrib import admin
from django.contrib.admin.options import IncorrectLookupParameters
from django.contrib.admin.views.main import PAGE_VAR, SEARCH_VAR, ChangeList
from django.core.paginator import InvalidPage, Page, Paginator
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils.functional import cached_property
from django.utils.text import capfirst
from django.utils.translation import gettext_lazy as _

from .live import live_settings, pop_refresh
from .reading import ReadsOffPrimaryMixin
from .utils import APP_CRUMB, admin_url

#: What a list's live update swaps: the rows and the paging under them (see
#: base_change_list.html); not the filters, the search box or the actions.
LIST_REGIONS = "#rdbtasks-results #rdbtasks-pagination"


class NoCountPaginator(Paginator):
    """Pages by LIMIT/OFFSET, reading one row more than a page to know if another follows.

    Django's changelist counts the filtered rows for its page links; on a
    table of millions of rows a COUNT(*) with a filter nobody indexed is a
    full scan on every page view. The count this paginator reports is a
    lower bound (the rows up to this page, plus one if more follow): enough
    for "previous/next" links; the admin shows the table's estimate beside.
    """

    def __init__(self, object_list: QuerySet, per_page: int, *, number: int) -> None:
        super().__init__(object_list, per_page)
        self.number = max(1, number)

    @cached_property
    def _rows(self) -> list[Any]:
        bottom = (self.number - 1) * self.per_page
        return list(self.object_list[bottom : bottom + self.per_page + 1])

    @cached_property
    def count(self) -> int:
        return (self.number - 1) * self.per_page + len(self._rows)

    @property
    def has_more(self) -> bool:
        return len(self._rows) > self.per_page

    def page(self, number: Any) -> Page:
        number = self.validate_number(number)
        if number == self.number:
            rows = self._rows[: self.per_page]
            # Paginator._get_page is Django's hook making the Page; django-stubs omits it.
            return self._get_page(rows, number, self)  # type: ignore[attr-defined]
        return super().page(number)


class NoCountChangeList(ChangeList):
    """A changelist paged by "previous/next" (see ``NoCountPaginator``).

    Django's ``get_results`` reads the whole filtered queryset again when it
    fits on one page; this one reads each page once, whatever it holds.
    """

    def get_results(self, request: HttpRequest) -> None:
        paginator = self.model_admin.get_paginator(request, self.queryset, self.list_per_page)
        try:
            self.result_list = paginator.page(self.page_num).object_list
        except InvalidPage as exc:
            raise IncorrectLookupParameters from exc
        shown = len(self.result_list)
        has_more = getattr(paginator, "has_more", False)
        self.paginator = paginator
        # The actions bar offers "select all N" when the count exceeds the page;
        # there is no count here, so selection is per page; bulk work has its
        # own views (retry all failed) and commands (requeue, prunetasks).
        self.result_count = shown
        self.full_result_count = None
        self.show_full_result_count = False
        self.show_admin_actions = True
        self.can_show_all = False
        self.multi_page = has_more or self.page_num > 1
        self.first_shown = (self.page_num - 1) * self.list_per_page + 1 if shown else 0
        self.last_shown = self.first_shown + shown - 1 if shown else 0
        self.previous_url = (
            self.get_query_string({PAGE_VAR: self.page_num - 1}) if self.page_num > 1 else ""
        )
        self.next_url = self.get_query_string({PAGE_VAR: self.page_num + 1}) if has_more else ""
        self.clear_search_url = self.get_query_string(remove=[SEARCH_VAR, PAGE_VAR])


if TYPE_CHECKING:
    # The mixins below are checked as the ModelAdmins they extend; at run time they
    # stay plain classes, so they never move ModelAdmin up an admin's MRO.
    _ModelAdminBase = admin.ModelAdmin
else:
    _ModelAdminBase = object


class AppPagesMixin(ReadsOffPrimaryMixin, _ModelAdminBase):
    """What every ModelAdmin of the app shares: its stylesheet, its breadcrumbs, where it reads."""

    empty_value_display = "—"

    class Media:
        css = {"all": ["django_rdbtasks/admin.css"]}
        # After the admin's actions.js, which it hands the rows swapped in.
        js = ["django_rdbtasks/live.js"]

    def _crumbs_context(self) -> dict[str, Any]:
        return {"app_crumb": APP_CRUMB, "ol_breadcrumbs": django.VERSION >= (6, 0)}

    def changelist_view(self, request: HttpRequest, extra_context: dict | None = None) -> Any:
        plural = capfirst(self.opts.verbose_name_plural)
        live = live_settings(request, LIST_REGIONS)
        pop_refresh(request)
        extra = {
            **self._crumbs_context(),
            "crumbs": [("", plural)],
            "live": live,
            **(extra_context or {}),
        }
        return super().changelist_view(request, extra)

    def changeform_view(
        self,
        request: HttpRequest,
        object_id: str | None = None,
        form_url: str = "",
        extra_context: dict | None = None,
    ) -> Any:
        opts = self.opts
        extra = {
            **self._crumbs_context(),
            "crumbs": [(admin_url(self.model, "changelist"), capfirst(opts.verbose_name_plural))],
            "add_label": _("Add %(name)s") % {"name": opts.verbose_name},
            **(extra_context or {}),
        }
        return super().changeform_view(request, object_id, form_url, extra)


class FastListMixin(AppPagesMixin):
    """No COUNT(*), no facets, no "show all" on big tables."""

    show_full_result_count = False
    show_facets = admin.ShowFacets.NEVER
    list_max_show_all = 0
    list_per_page = 50

    change_list_template = "django_rdbtasks/admin/change_list.html"

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[ChangeList]:
        return NoCountChangeList

    def get_paginator(
        self,
        request: HttpRequest,
        queryset: QuerySet,
        per_page: int,
        orphans: int = 0,
        allow_empty_first_page: bool = True,
    ) -> Paginator:
        try:
            number = int(request.GET.get(PAGE_VAR, 1))
        except ValueError:
            number = 1
        return NoCountPaginator(queryset, per_page, number=number)
