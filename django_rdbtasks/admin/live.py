"""Live updates of the dashboard and the lists: what a page tells ``live.js``.

The page fetches itself every few seconds and swaps its regions in place
(static/django_rdbtasks/live.js). ``?refresh=N`` sets the interval in seconds,
``?refresh=off`` starts the page paused; the operator's toggle on the page
does the same and is remembered by the browser.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.http import HttpRequest, QueryDict

REFRESH_VAR = "refresh"
DEFAULT_SECONDS = 5
#: An interval below a second would make the admin a load test of the database.
MIN_SECONDS, MAX_SECONDS = 1, 3600
OFF = "off"


@dataclass(frozen=True, slots=True)
class Live:
    #: Seconds between two fetches of the page.
    interval: int
    #: The page starts paused (``?refresh=off``).
    paused: bool
    #: CSS selectors of the regions swapped in place, space separated.
    regions: str

    @property
    def query(self) -> str:
        """``refresh=…`` for the page's own links, when it differs from the default."""
        if self.paused:
            return f"{REFRESH_VAR}={OFF}"
        return "" if self.interval == DEFAULT_SECONDS else f"{REFRESH_VAR}={self.interval}"


def live_settings(request: HttpRequest, regions: str) -> Live:
    value = request.GET.get(REFRESH_VAR, "").strip().lower()
    if value == OFF:
        return Live(DEFAULT_SECONDS, True, regions)
    try:
        seconds = int(value)
    except ValueError:
        seconds = DEFAULT_SECONDS
    return Live(min(max(seconds, MIN_SECONDS), MAX_SECONDS), False, regions)


def pop_refresh(request: HttpRequest) -> None:
    """Take ``refresh`` out of the query: a changelist reads any other key as a filter."""
    if REFRESH_VAR in request.GET:
        query = request.GET.copy()
        query.pop(REFRESH_VAR)
        # Immutable again, as Django hands it to views.
        request.GET = QueryDict(query.urlencode(), encoding=request.GET.encoding)
