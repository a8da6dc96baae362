"""Leased locks: one holder, renewal, takeover after a lapse with a larger fencing token."""

import os
import signal
import subprocess
import sys
import threading
import time

import pytest
from django.db import OperationalError

from django_rdbtasks.locks import LeasedLock, LockLost, LockNotAcquired
from django_rdbtasks.models import Lock, Task
from django_rdbtasks.worker import Worker
from tests.conftest import ROOT, wait_until
from tests.testapp import tasks
from tests.testapp.models import SideEffect

pytestmark = pytest.mark.django_db(transaction=True)


def test_one_holder_at_a_time_and_tokens_grow():
    first = LeasedLock("ranking", lease=0.5)
    second = LeasedLock("ranking", lease=0.5)
    assert first.acquire() and first.token == 1
    assert not second.acquire()
    time.sleep(0.7)  # first stops renewing: the lease lapses
    assert second.acquire() and second.token == 2
    assert not first.renew() and first.lost.is_set()
    with pytest.raises(LockLost):
        first.check()
    second.release()
    assert first.acquire() and first.token == 3


def test_context_manager_renews_while_held():
    # A lease long enough that a loaded machine (a renewal's commit waiting
    # behind other fsyncs, a thread not scheduled for a while) cannot let it
    # lapse between renewals: with 0.3 s this failed under load.
    with LeasedLock("long", lease=1.5) as lock:
        time.sleep(3.5)  # more than two leases long: only renewal keeps it
        lock.check()
        with pytest.raises(LockNotAcquired), LeasedLock("long", lease=1.5):
            pass
    assert Lock.objects.get(name="long").holder == ""


def test_check_raises_as_soon_as_the_lease_can_have_run_out():
    with LeasedLock("quiet", lease=1.5) as lock:
        lock.stop_renewing()  # a renewal thread that cannot run (GIL-bound code, a stall)
        lock.check()
        time.sleep(1.6)
        # Nobody took over and no renewal noticed anything: the lease alone decides.
        assert not lock.lost.is_set()
        assert Lock.objects.get(name="quiet").holder == lock.holder
        with pytest.raises(LockLost, match=r"not renewed for 1\.5s"):
            lock.check()
        # Nobody took over, so a late renewal (same token) makes it ours again.
        assert lock.renew()
        lock.check()


class UnreachableDatabase(LeasedLock):
    """Renewals fail as they would with the database away."""

    renewals = 0

    def renew(self) -> bool:
        self.renewals += 1
        raise OperationalError("server closed the connection unexpectedly")


def test_check_raises_when_renewals_keep_failing():
    with UnreachableDatabase("cut-off", lease=3.0) as lock:
        time.sleep(1.2)
        lock.check()  # renewals failing, but the lease is not over yet
        time.sleep(1.9)
        with pytest.raises(LockLost):
            lock.check()
        assert not lock.lost.is_set()
        assert lock.renewals >= 3  # it kept trying


class FlakyRenewals(LeasedLock):
    """The first two renewals fail as if the connection had dropped."""

    def __init__(self, name: str, *, lease: float) -> None:
        super().__init__(name, lease=lease)
        self.attempts: list[float] = []

    def renew(self) -> bool:
        self.attempts.append(time.monotonic())
        if len(self.attempts) <= 2:
            raise OperationalError("server closed the connection unexpectedly")
        return super().renew()


def test_a_failed_renewal_is_retried_before_the_next_interval():
    with FlakyRenewals("flaky", lease=3.0) as lock:  # renewed every second
        wait_until(lambda: len(lock.attempts) >= 3, timeout=10)
        first, second, third = lock.attempts[:3]
        # Backoff from 0.1 s, not a whole interval: two failures cannot cost the lease.
        assert second - first < 0.8 and third - second < 0.8
        lock.check()
        assert not lock.lost.is_set()


def test_check_raises_before_acquire_and_after_release():
    lock = LeasedLock("unheld", lease=5)
    with pytest.raises(LockLost, match="not held"):
        lock.check()
    assert lock.acquire()
    lock.check()
    lock.release()
    with pytest.raises(LockLost, match="not held"):
        lock.check()


def test_blocking_acquire_waits_for_the_lease_to_lapse_or_the_timeout():
    holder = LeasedLock("queue-head", lease=1.0)
    assert holder.acquire()  # and never renews: the lease lapses after a second
    waiter = LeasedLock("queue-head", lease=1.0)
    started = time.monotonic()
    assert waiter.acquire(blocking=True, timeout=10)
    assert 0.5 < time.monotonic() - started < 5
    assert waiter.token == holder.token + 1

    waiter.start_renewing()
    try:
        impatient = LeasedLock("queue-head", lease=1.0)
        started = time.monotonic()
        assert not impatient.acquire(blocking=True, timeout=0.6)
        assert 0.6 <= time.monotonic() - started < 3
        assert not impatient.acquire()  # the default: no waiting at all
        waiter.check()
    finally:
        waiter.stop_renewing()
        waiter.release()
    assert impatient.acquire(blocking=True, timeout=5)


def test_with_does_not_wait():
    with LeasedLock("busy", lease=5):
        started = time.monotonic()
        with pytest.raises(LockNotAcquired, match="'busy' is held"), LeasedLock("busy"):
            pass
        assert time.monotonic() - started < 2


HOLDER = """
import time, django
django.setup()
from django_rdbtasks.locks import LeasedLock
with LeasedLock("hot-ranking", lease=1.0):
    print("held", flush=True)
    time.sleep(600)
"""


def test_killed_holder_is_taken_over_after_the_lease():
    env = {
        **os.environ,
        "RDBTASKS_TEST_WORKER": "1",
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "PYTHONPATH": str(ROOT),
    }
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER], env=env, cwd=ROOT, stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        old = Lock.objects.get(name="hot-ranking")
        contender = LeasedLock("hot-ranking", lease=5)
        time.sleep(1.5)  # the holder renews: still held past its first lease
        assert not contender.acquire()
        holder.send_signal(signal.SIGKILL)
        holder.wait()
        wait_until(contender.acquire, timeout=10, interval=0.1)
        assert contender.token == old.token + 1
        assert Lock.objects.get(name="hot-ranking").holder == contender.holder
    finally:
        holder.kill()
        holder.wait()


def test_singleton_task_never_runs_twice_at_once():
    for i in range(3):
        tasks.exclusive.enqueue(f"x{i}", 0.3)
    worker = Worker(threads=3, poll_interval=0.1)
    thread = threading.Thread(target=worker.run, kwargs={"install_signals": False})
    thread.start()
    try:
        wait_until(lambda: Task.objects.filter(status="SUCCESSFUL").count() == 3, timeout=60)
    finally:
        worker.stop()
        thread.join(30)
    assert SideEffect.objects.count() == 3
    assert max(Task.objects.values_list("return_value", flat=True)) == 1  # peak concurrency
    assert set(Task.objects.values_list("attempts", flat=True)) == {1}  # waiting spent nothing
