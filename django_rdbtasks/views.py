"""The database's gauges for Prometheus: queue depth, lag, live workers.

Include ``django_rdbtasks.urls`` (``path("rdbtasks/", include("django_rdbtasks.urls"))``)
and scrape ``/rdbtasks/metrics/``. Who may read it:

- a request with ``Authorization: Bearer <RDBTASKS_METRICS_TOKEN>``, when that
  setting is set (what a Prometheus scrape job sends: ``authorization:
  credentials``);
- otherwise, or without the header, a logged-in active staff user who may see
  the admin's dashboard (the ``django_rdbtasks.view_task`` permission; every
  queue is shown, whatever the per-queue permissions).

Anyone else gets 403. Each request reads the database afresh (the admin
dashboard's queries, ``snapshots.snapshot``) into a registry of its own; nothing is
kept between requests.
"""

from __future__ import annotations

import hmac

from django.http import HttpRequest, HttpResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET

from .conf import project_settings


def allowed(request: HttpRequest) -> bool:
    token = project_settings().metrics_token
    header = request.headers.get("Authorization", "")
    if token and header.startswith("Bearer "):
        # A constant-time comparison: the token is a password.
        return hmac.compare_digest(header.removeprefix("Bearer ").encode(), token.encode())
    user = getattr(request, "user", None)
    return bool(
        user is not None
        and user.is_active
        and user.is_staff
        and user.has_perm("django_rdbtasks.view_task")
    )


@never_cache
@require_GET
def metrics(request: HttpRequest, using: str | None = None) -> HttpResponse:
    """Prometheus text format; ``using`` (a URL kwarg) picks the database (default: the router)."""
    if not allowed(request):
        return HttpResponse("Forbidden\n", status=403, content_type="text/plain")
    try:
        from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
    except ImportError:
        return HttpResponse(
            "prometheus-client is not installed: pip install 'django-rdbtasks[metrics]'\n",
            status=501,
            content_type="text/plain",
        )
    from .observability.limit_metrics import LimitCollector
    from .observability.metrics import DatabaseCollector

    registry = CollectorRegistry(auto_describe=False)
    registry.register(DatabaseCollector(using))
    registry.register(LimitCollector(using))
    return HttpResponse(generate_latest(registry), content_type=CONTENT_TYPE_LATEST)
