"""Live updates: what the dashboard and the lists tell live.js (tests/browser runs it)."""

from __future__ import annotations

import pytest
from django.conf import settings
from django.test import RequestFactory

from django_rdbtasks.models import TaskStatus
from tests.browser.support import (
    VIEW,
    admin_urls,
    client_for,
    make_task,
    make_worker,
    require_admin,
    text,
    url,
)

if "django.contrib.admin" in settings.INSTALLED_APPS:
    from django_rdbtasks.admin.live import live_settings, pop_refresh

pytestmark = [*admin_urls(), pytest.mark.usefixtures("require_admin")]
__all__ = ["require_admin"]


@pytest.mark.parametrize(
    ("query", "interval", "paused"),
    [
        ({}, 5, False),
        ({"refresh": "10"}, 10, False),
        ({"refresh": "0"}, 1, False),  # never faster than a second
        ({"refresh": "99999"}, 3600, False),
        ({"refresh": "soon"}, 5, False),
        ({"refresh": "off"}, 5, True),
        ({"refresh": "OFF"}, 5, True),
    ],
)
def test_the_refresh_parameter_sets_the_interval_or_pauses(query, interval, paused) -> None:
    live = live_settings(RequestFactory().get("/", query), "#a #b")
    assert (live.interval, live.paused, live.regions) == (interval, paused, "#a #b")


def test_the_refresh_parameter_is_taken_out_of_the_query() -> None:
    request = RequestFactory().get("/", {"refresh": "off", "status": "FAILED"})
    pop_refresh(request)
    assert dict(request.GET.items()) == {"status": "FAILED"}


@pytest.mark.django_db
def test_the_dashboard_updates_in_place_with_no_meta_refresh() -> None:
    client = client_for(*VIEW)
    page = text(client.get(url("task_dashboard")))
    assert 'http-equiv="refresh"' not in page
    assert "django_rdbtasks/live.js" in page
    assert 'id="rdbtasks-live-region"' in page
    assert 'data-interval="5"' in page and "data-paused" not in page
    asked = text(client.get(url("task_dashboard"), {"refresh": "10"}))
    assert 'data-interval="10"' in asked
    assert "?range=24h&amp;refresh=10" in asked  # the ranges keep it
    off = text(client.get(url("task_dashboard"), {"refresh": "off"}))
    assert "data-paused" in off and "?range=24h&amp;refresh=off" in off


@pytest.mark.django_db
@pytest.mark.parametrize("name", ["task", "worker", "job", "jobrecord"])
def test_every_list_updates_in_place_and_takes_refresh_as_no_filter(name) -> None:
    client = client_for(superuser=True)
    response = client.get(url(f"{name}_changelist"), {"refresh": "off"})
    # A changelist reads an unknown parameter as a filter and redirects to ?e=1.
    assert response.status_code == 200, response.get("Location")
    page = text(response)
    assert "django_rdbtasks/live.js" in page
    assert 'id="rdbtasks-results"' in page and 'id="rdbtasks-pagination"' in page
    assert "data-paused" in page
    assert 'data-regions="#rdbtasks-results #rdbtasks-pagination"' in page


@pytest.mark.django_db
def test_a_filtered_list_stays_filtered_with_refresh() -> None:
    failed = make_task(TaskStatus.FAILED)
    ready = make_task()
    make_worker()
    page = text(client_for(*VIEW).get(url("task_changelist"), {"status": "FAILED", "refresh": "2"}))
    assert url("task_change", failed.pk) in page and url("task_change", ready.pk) not in page
    assert 'data-interval="2"' in page
