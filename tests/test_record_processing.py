"""Record check-out: one holder at a time, fenced check-in, reclaim after a crash."""

import datetime as dt
import itertools
import os
import signal
import threading
import time
from collections import Counter, defaultdict
from datetime import timedelta

import pytest
from django.db import OperationalError

from django_rdbtasks.record_processing import CheckoutStatus, RecordProcessor, run_processor
from tests.conftest import wait_until, worker_children
from tests.testapp.models import Device, DeviceVisit

pytestmark = pytest.mark.django_db(transaction=True)


def make_devices(count):
    Device.objects.bulk_create(Device(name=f"d{i}") for i in range(count))


def test_check_out_gives_each_record_to_one_holder():
    make_devices(30)
    first = Device.objects.check_out("one", limit=20)
    second = Device.objects.check_out("two", limit=20)
    assert len(first) == 20 and len(second) == 10
    assert not {d.pk for d in first} & {d.pk for d in second}
    assert Device.objects.check_out("three", limit=5) == []
    assert all(d.checkout_status == CheckoutStatus.CHECKED_OUT for d in first)


def test_check_in_schedules_the_next_visit():
    make_devices(1)
    [device] = Device.objects.check_out("me")
    assert device.check_in(next_due_in=timedelta(minutes=15))
    device.refresh_from_db()
    assert device.checkout_status == CheckoutStatus.IDLE and device.checked_out_by == ""
    assert device.next_due_at - device.checkout_status_changed_at == timedelta(minutes=15)
    assert Device.objects.check_out("me") == []  # not due for 15 minutes


def test_lapsed_check_out_is_reclaimed_and_the_old_holder_fenced():
    make_devices(1)
    [stale] = Device.objects.check_out("crashed", lease=0.2)
    time.sleep(0.4)
    [fresh] = Device.objects.check_out("alive", lease=30)
    assert fresh.checkout_version == stale.checkout_version + 1
    assert not stale.renew_checkout()
    assert not stale.check_in(next_due_in=timedelta(0), error="late")
    assert fresh.renew_checkout() and fresh.check_in(next_due_in=timedelta(minutes=1))


def test_skip_locked_mode(vendor):
    if vendor == "sqlite":
        pytest.skip("SQLite has no SELECT ... FOR UPDATE SKIP LOCKED")
    make_devices(10)
    first = Device.objects.check_out("one", limit=6, mode="skip-locked")
    second = Device.objects.check_out("two", limit=6, mode="skip-locked")
    assert len(first) == 6 and len(second) == 4
    assert not {d.pk for d in first} & {d.pk for d in second}


def _run_in_thread(processor, holder):
    stopping = threading.Event()
    thread = threading.Thread(
        target=run_processor, args=(processor, holder, stopping), kwargs={"poll_interval": 0.05}
    )
    thread.start()
    return stopping, thread


def test_record_is_renewed_while_it_is_processed():
    make_devices(1)
    processed = threading.Event()

    def slow(device):
        time.sleep(3.0)  # two and a half leases
        processed.set()

    processor = RecordProcessor(Device, slow, every=timedelta(minutes=5), lease=1.2)
    stopping, thread = _run_in_thread(processor, "slow-holder")
    try:
        wait_until(lambda: Device.objects.checked_out_by("slow-holder").exists(), timeout=10)
        while not processed.is_set():
            assert Device.objects.check_out("thief", lease=30) == []  # never lapses
            time.sleep(0.1)
        wait_until(
            lambda: Device.objects.filter(checkout_status=CheckoutStatus.IDLE).exists(), timeout=10
        )
    finally:
        stopping.set()
        thread.join(30)
    device = Device.objects.get()
    assert device.last_error == "" and device.checkout_version == 2  # out, and in by its holder
    assert device.next_due_at - device.checkout_status_changed_at == timedelta(minutes=5)


def test_check_out_is_retried_through_database_errors(monkeypatch):
    make_devices(1)
    visited = []
    calls = []
    real_check_out = Device.objects.check_out

    def flaky_check_out(*args, **kwargs):
        calls.append(time.monotonic())
        if len(calls) <= 2:
            raise OperationalError("server closed the connection unexpectedly")
        return real_check_out(*args, **kwargs)

    monkeypatch.setattr(Device._default_manager, "check_out", flaky_check_out)
    processor = RecordProcessor(Device, visited.append, every=timedelta(minutes=5))
    stopping, thread = _run_in_thread(processor, "patient")
    try:
        wait_until(lambda: visited, timeout=10)
    finally:
        stopping.set()
        thread.join(30)
    assert not thread.is_alive()
    assert [d.name for d in visited] == ["d0"]
    assert calls[2] - calls[0] < 1.0  # backed off from 0.1 s, not given up


def test_records_waiting_in_their_batch_are_kept_past_the_lease():
    # A batch slower than the lease: its last records must not lapse and be
    # taken by another holder before their turn (under load, every batch was
    # this slow, and the records at its end were passed on and on, never visited).
    make_devices(4)
    visited = []

    def slow(device):
        time.sleep(0.6)
        visited.append(device.pk)

    processor = RecordProcessor(Device, slow, every=timedelta(minutes=5), batch=4, lease=0.6)
    stopping, thread = _run_in_thread(processor, "batch-holder")
    try:
        wait_until(lambda: Device.objects.checked_out_by("batch-holder").count() == 4, timeout=10)
        while len(visited) < 4:
            assert Device.objects.check_out("thief", lease=30) == []  # none lapses
            time.sleep(0.05)
            assert thread.is_alive()
    finally:
        stopping.set()
        thread.join(30)
    assert sorted(visited) == sorted(Device.objects.values_list("pk", flat=True))
    assert set(Device.objects.values_list("checkout_version", flat=True)) == {2}


@pytest.mark.slow
def test_competing_processes_visit_each_record_once_per_cycle(run_workers, monkeypatch, vendor):
    every = 2.0
    # SQLite has one writer at a time: the same race, smaller.
    count, processes = (1000, "4") if vendor != "sqlite" else (200, "2")
    monkeypatch.setenv("RDBTASKS_TEST_PROCESSORS", "1")
    monkeypatch.setenv("RDBTASKS_TEST_PROCESS_EVERY", str(every))
    make_devices(count)
    workers = run_workers(
        "--processes",
        processes,
        "--no-scheduler",
        "--poll-interval",
        "0.2",
        "--log-level",
        "WARNING",
    )
    wait_until(lambda: DeviceVisit.objects.values("device").distinct().count() == count, timeout=60)
    time.sleep(1.0)
    victim = worker_children(workers.pid)[0]
    os.kill(victim, signal.SIGKILL)  # mid-cycle: its check-outs are left behind
    wait_until(lambda: DeviceVisit.objects.count() >= count * 3.5, timeout=120)
    workers.signal(signal.SIGTERM)
    assert workers.wait(timeout=60) == 0, workers.log()

    visits = defaultdict(list)
    for v in DeviceVisit.objects.order_by("started_at").values(
        "device_id", "pid", "started_at", "finished_at"
    ):
        visits[v["device_id"]].append(v)
    assert len(visits) == count
    fewest = min(visits.values(), key=len)
    device = Device.objects.get(pk=fewest[0]["device_id"])
    assert len(fewest) >= 2, (  # several cycles
        f"victim {victim}; {DeviceVisit.objects.count()} visits; fewest: {fewest}; its device "
        f"now: {device.checkout_status} due {device.next_due_at} v{device.checkout_version}; "
        f"visits per device: {sorted(Counter(len(v) for v in visits.values()).items())}"
    )
    shortest_gap = dt.timedelta(seconds=every - 0.05)
    for device_visits in visits.values():
        for before, after in itertools.pairwise(device_visits):
            assert after["started_at"] >= before["finished_at"]  # never at once
            if before["pid"] != victim:
                assert after["started_at"] - before["finished_at"] >= shortest_gap
    assert any(
        v[-1]["pid"] != victim for v in visits.values() if any(x["pid"] == victim for x in v)
    )
    # The victim's check-outs came back: nothing is left checked out.
    assert not Device.objects.filter(checkout_status=CheckoutStatus.CHECKED_OUT).exists()
