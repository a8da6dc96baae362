"""The worker registry: heartbeats through an outage, and marking a registration stopped."""

import logging
import os
import socket
import subprocess
import sys
import threading
from datetime import timedelta

import pytest
from django.db import connection, connections
from django.db.utils import load_backend
from django.utils import timezone

from django_rdbtasks.worker.registry import REGISTRY_ADVICE, Registry, mark_gone
from tests.conftest import wait_until

pytestmark = pytest.mark.django_db(transaction=True)

ALIAS = "rdbtasks_unreachable"


def in_new_thread(function):
    """A connection made here belongs to the thread that made it: test in a fresh one."""
    outcome = {}

    def target():
        try:
            outcome["value"] = function()
        except BaseException as exc:  # reported in the test's thread
            outcome["error"] = exc
        finally:
            try:
                connections[ALIAS].close()
            except Exception:
                pass

    thread = threading.Thread(target=target)
    thread.start()
    thread.join(120)
    if "error" in outcome:
        raise outcome["error"]
    return outcome.get("value")


def unreachable_wrapper():
    """A connection to the test database's server, on a port nothing listens on."""
    settings = dict(connection.settings_dict)
    if connection.vendor == "sqlite":
        settings["NAME"] = "/nonexistent-rdbtasks-dir/registry.sqlite3"
    else:
        settings.update(HOST="127.0.0.1", PORT="1")
    settings.update(CONN_MAX_AGE=None, CONN_HEALTH_CHECKS=False, AUTOCOMMIT=True)
    wrapper = load_backend(settings["ENGINE"]).DatabaseWrapper(settings, ALIAS)
    connections[ALIAS] = wrapper
    return wrapper


def test_a_server_gone_for_long_is_reported_first_then_every_twentieth_heartbeat(caplog):
    def heartbeats():
        wrapper = unreachable_wrapper()
        registry = Registry(ALIAS, "host:1")
        with caplog.at_level(logging.DEBUG, logger="django_rdbtasks.worker"):
            for _ in range(45):
                registry.alive(running=0, done=0, failed=0)
            # The server is back: the next heartbeat reconnects and says so.
            wrapper.settings_dict.update(
                NAME=connection.settings_dict["NAME"],
                HOST=connection.settings_dict["HOST"],
                PORT=connection.settings_dict["PORT"],
            )
            registry.alive(running=0, done=0, failed=0)

    in_new_thread(heartbeats)
    failures = [r for r in caplog.records if "could not update the worker registry" in r.message]
    assert len(failures) == 45
    loud = [r for r in failures if r.levelno == logging.WARNING]
    # The first, the 20th and the 40th: as every other retry loop of the worker.
    assert len(loud) == 3, [r.message for r in loud]
    assert REGISTRY_ADVICE in loud[0].message
    assert sum(REGISTRY_ADVICE in r.message for r in caplog.records) == 1
    assert "[20 heartbeats in a row]" in loud[1].message
    assert any("updated again after 45 failed heartbeats" in r.message for r in caplog.records)


def _register(pid, stopped_at=None):
    from django_rdbtasks.db.functions import DbNow
    from django_rdbtasks.models import Worker

    return Worker.objects.create(
        name=f"{socket.gethostname()}:{pid}",
        host=socket.gethostname(),
        pid=pid,
        mode="optimistic",
        stopped_at=stopped_at,
        last_heartbeat_at=DbNow(),
    )


def test_marking_ended_processes_stopped_never_touches_a_live_registration():
    from django_rdbtasks.models import Worker

    ended = subprocess.Popen([sys.executable, "-c", "pass"])
    ended.wait()
    # A zombie: ended, not reaped, its pid taken by nobody else yet.
    zombie = subprocess.Popen([sys.executable, "-c", "pass"])
    wait_until(lambda: _state(zombie.pid) == "Z", timeout=30)
    long_stopped = timezone.now() - timedelta(hours=1)
    _register(ended.pid)
    _register(zombie.pid)
    _register(os.getpid())  # a live registration under a pid the caller believes ended
    _register(999_999_999, stopped_at=long_stopped)
    try:
        assert mark_gone("default", [ended.pid, zombie.pid, os.getpid(), 999_999_999]) == 2
    finally:
        zombie.wait()
    stopped = dict(Worker.objects.values_list("pid", "stopped_at"))
    assert stopped[ended.pid] is not None and stopped[zombie.pid] is not None
    assert stopped[os.getpid()] is None
    assert stopped[999_999_999] == long_stopped  # already stopped: left as it was
    assert Worker.objects.get(pid=ended.pid).running == 0


def _state(pid):
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]
