"""Lost races (a real deadlock) are retried at once on the same connection; outages are not."""

from __future__ import annotations

import logging
import threading
import time

import pytest
from django.db import DatabaseError, connection, connections, transaction

from django_rdbtasks.retrying import LeaseRenewer, is_lost_race, lost_races, retry_database
from tests.conftest import wait_until
from tests.testapp.models import SideEffect

pytestmark = pytest.mark.django_db(transaction=True)

#: Rows the helper thread writes before the deadlock: heavier than the main
#: thread's transaction, so InnoDB picks the main thread as its victim.
HEAVY = 20


@pytest.fixture
def rows(vendor):
    if vendor == "sqlite":
        pytest.skip("SQLite has one writer at a time: no row locks to deadlock on")
    return [SideEffect.objects.create(key=f"row{i}").pk for i in range(HEAVY + 2)]


def deadlock_once(rows: list[int]) -> None:
    """Deadlock this thread's transaction against a helper's; this thread is the victim.

    The main thread waits first (so on PostgreSQL its deadlock_timeout runs out
    first and it is the one aborted) and has written less (so InnoDB aborts it).
    """
    a, b, heavy = rows[0], rows[1], rows[2:]
    helper_holds_b = threading.Event()
    release_helper = threading.Event()

    def helper() -> None:
        try:
            with transaction.atomic():
                SideEffect.objects.filter(pk__in=[b, *heavy]).update(pid=2)
                helper_holds_b.set()
                # Wait until the main thread is blocked on b, then close the cycle.
                time.sleep(0.3)
                SideEffect.objects.filter(pk=a).update(pid=2)
                release_helper.wait(30)
        finally:
            connections.close_all()

    thread = threading.Thread(target=helper)
    thread.start()
    try:
        with transaction.atomic():
            SideEffect.objects.filter(pk=a).update(pid=1)
            assert helper_holds_b.wait(10)
            SideEffect.objects.filter(pk=b).update(pid=1)  # blocks; the deadlock ends it
    finally:
        release_helper.set()
        thread.join(60)


def test_a_real_deadlock_is_a_lost_race_and_other_errors_are_not(rows):
    with pytest.raises(DatabaseError) as deadlock:
        deadlock_once(rows)
    assert is_lost_race(deadlock.value), repr(deadlock.value)

    with pytest.raises(DatabaseError) as missing:
        with connection.cursor() as cursor:
            cursor.execute("SELECT * FROM no_such_table")
    assert not is_lost_race(missing.value)


def test_retry_database_retries_a_lost_race_on_the_same_connection_at_debug(rows, caplog):
    attempts: list[int] = []
    resets: list[int] = []

    def claim() -> str:
        attempts.append(len(attempts))
        if len(attempts) == 1:
            deadlock_once(rows)
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
        return "won"

    connection.ensure_connection()
    session = connection.connection
    counted = lost_races.count
    with caplog.at_level(logging.DEBUG, logger="django_rdbtasks"):
        result = retry_database(
            claim,
            "claim",
            alias=None,
            stop=threading.Event(),
            on_error=lambda: resets.append(1),
        )
    assert result == "won"
    assert len(attempts) == 2
    assert resets == []  # not treated as an outage: the connection was kept
    assert connection.connection is session
    assert lost_races.count == counted + 1
    races = [r for r in caplog.records if r.name == "django_rdbtasks.races"]
    assert len(races) == 1 and races[0].levelno == logging.DEBUG
    assert "lost a race during claim" in races[0].getMessage()
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_retry_database_still_treats_other_errors_as_an_outage(caplog):
    attempts: list[int] = []

    def query() -> str:
        attempts.append(1)
        with connection.cursor() as cursor:
            cursor.execute("SELECT * FROM no_such_table" if len(attempts) == 1 else "SELECT 1")
        return "done"

    with caplog.at_level(logging.DEBUG, logger="django_rdbtasks"):
        result = retry_database(query, "scheduling", alias="default", stop=threading.Event())
    assert result == "done" and len(attempts) == 2
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "database error during scheduling" in warnings[0].getMessage()


def test_a_lost_race_inside_a_callers_transaction_is_not_retried_as_one(rows, caplog):
    """The server rolled back the caller's whole transaction: redoing our part alone is wrong."""
    attempts: list[int] = []
    stop = threading.Event()

    def inner() -> None:
        attempts.append(1)
        stop.set()  # one try is all this test needs to see
        deadlock_once(rows)

    with caplog.at_level(logging.DEBUG, logger="django_rdbtasks"):
        with transaction.atomic():
            assert retry_database(inner, "inner", alias="default", stop=stop) is None
    assert attempts == [1]
    assert not [r for r in caplog.records if r.name == "django_rdbtasks.races"]


def test_a_lease_renewal_that_lost_a_race_is_retried_without_a_warning(rows, caplog):
    with pytest.raises(DatabaseError) as deadlock:
        deadlock_once(rows)
    calls: list[float] = []

    def renew() -> bool:
        calls.append(time.monotonic())
        if len(calls) <= 2:
            raise deadlock.value
        return True

    with caplog.at_level(logging.DEBUG, logger="django_rdbtasks"):
        renewer = LeaseRenewer(renew, interval=2.0, name="race-renewer").start()
        try:
            wait_until(lambda: len(calls) >= 3, timeout=10)
        finally:
            renewer.stop()
    assert not renewer.lost.is_set()
    # Retried within the race backoff (milliseconds), not after another interval.
    assert calls[2] - calls[0] < 1.0
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len([r for r in caplog.records if r.name == "django_rdbtasks.races"]) == 2


def test_a_signal_ends_the_wait_between_two_tries_at_once():
    """A signal handler cannot set an Event: its flag is read during the backoff too."""
    calls: list[float] = []
    flagged: list[float] = []

    def operation() -> None:
        calls.append(time.monotonic())
        if len(calls) == 5:  # the next wait is 0.8 to 2.4 s
            threading.Timer(0.05, lambda: flagged.append(time.monotonic())).start()
        with connection.cursor() as cursor:
            cursor.execute("SELECT * FROM rdbtasks_no_such_table")

    got = retry_database(
        operation, "test", alias="default", stop=threading.Event(), give_up=lambda: bool(flagged)
    )
    assert got is None and len(calls) == 5
    assert time.monotonic() - flagged[0] < 0.3


def test_stopping_a_renewer_waits_for_a_renewal_in_flight_only_so_long():
    entered, answer = threading.Event(), threading.Event()
    lost: list[bool] = []

    def renew() -> bool:
        entered.set()
        answer.wait(10)  # a renewal blocked on a server that does not answer
        return False

    renewer = LeaseRenewer(
        renew, interval=0.05, name="stuck-renewer", on_lost=lambda: lost.append(True)
    ).start()
    assert entered.wait(5)
    started = time.monotonic()
    assert renewer.stop(within=0.3) is False
    assert time.monotonic() - started < 1.0
    answer.set()
    assert renewer.stop(within=5) is True
    # Its late answer came after the stop: no loss reported to a caller that moved on.
    assert not renewer.lost.is_set() and not lost
