"""The limits page: each key's limit, slots in use and tasks waiting; for who sees every queue."""

from __future__ import annotations

import pytest

from tests.browser.support import VIEW, admin_urls, client_for, require_admin, text, url
from tests.test_limit_usage import busy_keys

pytestmark = [pytest.mark.django_db, *admin_urls(), pytest.mark.usefixtures("require_admin")]
__all__ = ["require_admin"]


def test_the_page_lists_each_key_with_its_use_and_waiting():
    busy_keys()
    response = client_for(*VIEW).get(url("limitslot_changelist"))
    assert response.status_code == 200
    page = text(response)
    assert "provider" in page and "customer:a" in page and "customer:b" in page
    assert "20 per 1 h 0 min" in page  # the rate limit and its window
    assert "2 at once" in page
    assert page.count("rdbtasks-alert") >= 2  # full keys stand out


def test_the_page_is_read_only_and_not_for_everyone(settings):
    assert client_for().get(url("limitslot_changelist")).status_code == 403
    settings.RDBTASKS_QUEUE_PERMISSIONS = {"emails": ["mailing"]}
    client = client_for(*VIEW, name="mailer")
    assert client.get(url("limitslot_changelist")).status_code == 403
