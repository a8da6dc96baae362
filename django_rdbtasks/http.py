"""A built-in task that calls an HTTP endpoint: webhooks as Jobs, with no code.

Outbound hosts must be listed in ``RDBTASKS_HTTP_ALLOWED_HOSTS`` (nothing is
allowed by default), redirects included. 5xx, 429, timeouts and connection
errors are retried (the task's ``max_attempts``); an unexpected 4xx and a host
that is not allowed fail at once.
"""

from __future__ import annotations

import fnmatch
import json
import urllib.error
import urllib.request
from collections.abc import Iterable
from typing import Any
from urllib.parse import urlsplit

from .compat import HAS_DJANGO_TASKS
from .conf import project_settings

if HAS_DJANGO_TASKS:
    from django.tasks import task
else:  # one name, two homes: mypy types it by the first (django.tasks)
    from django_tasks import task  # type: ignore[no-redef]

#: Header names whose values the admin never shows.
SENSITIVE_HEADER_WORDS = ("authorization", "cookie", "token", "secret", "key", "password", "auth")


class HttpTaskError(Exception):
    retryable = True


class HostNotAllowed(HttpTaskError):
    retryable = False


class UnexpectedStatus(HttpTaskError):
    """A status that is neither expected nor worth retrying (most 4xx)."""

    retryable = False


class RetryableStatus(HttpTaskError):
    """5xx or 429: the server may answer differently next time."""


def allowed_hosts() -> list[str]:
    return list(project_settings().http_allowed_hosts)


def check_allowed(url: str) -> None:
    """Refuse any URL whose scheme is not HTTP(S) or whose host is not allowed.

    Patterns match the host (``api.example.com``, ``*.example.com``) or the
    host and port (``127.0.0.1:8080``).
    """
    parts = urlsplit(url)
    if parts.scheme not in {"http", "https"} or not parts.hostname:
        raise HostNotAllowed(f"{url!r} is not an http(s) URL.")
    host = parts.hostname.lower()
    with_port = f"{host}:{parts.port}" if parts.port else host
    for pattern in allowed_hosts():
        pattern = pattern.lower()
        if fnmatch.fnmatchcase(host, pattern) or fnmatch.fnmatchcase(with_port, pattern):
            return
    raise HostNotAllowed(
        f"Host {with_port!r} is not in RDBTASKS_HTTP_ALLOWED_HOSTS; requests go nowhere else."
    )


class _CheckedRedirects(urllib.request.HTTPRedirectHandler):
    def redirect_request(
        self, req: Any, fp: Any, code: int, msg: str, headers: Any, newurl: str
    ) -> Any:
        check_allowed(newurl)
        return super().redirect_request(req, fp, code, msg, headers, newurl)


_opener = urllib.request.build_opener(_CheckedRedirects)


def _expected(status: int, expected: Iterable[int] | None) -> bool:
    return status in set(expected) if expected else 200 <= status < 300


def redact_kwargs(kwargs: dict[str, Any]) -> dict[str, Any]:
    """The task's kwargs with secret header values hidden, for display."""
    shown = dict(kwargs)
    headers = shown.get("headers")
    if isinstance(headers, dict):
        shown["headers"] = {
            name: "••••••" if any(w in name.lower() for w in SENSITIVE_HEADER_WORDS) else value
            for name, value in headers.items()
        }
    return shown


# Both ``task`` decorators pass extra keywords to the backend's task class (``RDBTask``
# takes ``max_attempts``); django-stubs declares no extra keywords.
@task(max_attempts=5)  # type: ignore[call-overload]
def http_request(
    url: str,
    method: str = "POST",
    headers: dict[str, str] | None = None,
    json_body: Any = None,
    timeout: float = 10.0,
    expected_status: list[int] | None = None,
    excerpt: int = 2000,
) -> dict[str, Any]:
    """Call ``url``; return the status and the start of the body."""
    check_allowed(url)
    data = None
    request_headers = dict(headers or {})
    if json_body is not None:
        data = json.dumps(json_body).encode()
        request_headers.setdefault("Content-Type", "application/json")
    request = urllib.request.Request(url, data=data, headers=request_headers, method=method.upper())
    try:
        with _opener.open(request, timeout=timeout) as response:
            status, body = response.status, response.read(excerpt)
    except urllib.error.HTTPError as error:
        status, body = error.code, error.read(excerpt)
    except (urllib.error.URLError, TimeoutError, ConnectionError) as error:
        reason = getattr(error, "reason", error)
        if isinstance(reason, HostNotAllowed):
            raise reason from None
        raise HttpTaskError(f"{method.upper()} {url} failed: {reason}") from None
    text = body.decode("utf-8", errors="replace")
    if _expected(status, expected_status):
        return {"status": status, "body": text}
    message = f"{method.upper()} {url} answered {status}: {text[:200]}"
    if status >= 500 or status == 429:
        raise RetryableStatus(message)
    raise UnexpectedStatus(message)
