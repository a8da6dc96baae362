"""The limits' gauges, served by the metrics view."""

import pytest
from django.contrib.auth.models import Permission, User
from django.test import Client

from tests.test_limit_usage import busy_keys
from tests.test_metrics import samples, value

pytestmark = [pytest.mark.django_db, pytest.mark.urls("django_rdbtasks.urls")]


def test_the_view_serves_each_keys_limit_use_and_waiting():
    busy_keys()
    client = Client()
    user = User.objects.create_user("ops", is_staff=True)
    user.user_permissions.add(Permission.objects.get(codename="view_task"))
    client.force_login(user)
    response = client.get("/metrics/")
    assert response.status_code == 200, response.content
    found = samples(response.content.decode())
    rate = {"key": "provider", "kind": "rate"}
    assert value(found, "rdbtasks_limit_slots", **rate) == 20
    assert value(found, "rdbtasks_limit_in_use", **rate) == 20
    assert value(found, "rdbtasks_limit_waiting", **rate) == 5
    a = {"key": "customer:a", "kind": "concurrency"}
    assert value(found, "rdbtasks_limit_slots", **a) == 2
    assert value(found, "rdbtasks_limit_in_use", **a) == 2
    assert value(found, "rdbtasks_limit_waiting", **a) == 1
