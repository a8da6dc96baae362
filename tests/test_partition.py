"""A worker cut off from PostgreSQL by a silent drop: a real network namespace, iptables DROP.

The worker runs in a namespace of its own (``ip netns exec``), joined to this
one by a veth pair with addresses of its own; a relay on this side's address
forwards to the test server (which listens on 127.0.0.1 only). Cutting the
link drops every packet both ways inside the namespace: no RST, no ICMP, what
a dead switch or a changed security group looks like. Each test creates and
deletes its namespace, even when it fails.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator

import pytest
from django.db import connection

from django_rdbtasks.models import Task
from django_rdbtasks.states import AttemptOutcome, TaskStatus
from tests.conftest import WorkerProcess, wait_until, worker_children
from tests.testapp import tasks
from tests.testapp.models import SideEffect

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def _unavailable() -> str | None:
    if connection.vendor != "postgresql":
        return "PostgreSQL only: the partition tests cut a worker off from a PostgreSQL server"
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return "network namespaces and iptables need root (CI runs as root)"
    for tool in ("ip", "iptables"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (apt-get install iproute2 iptables)"
    return None


def _run(*command: str) -> None:
    subprocess.run(command, check=True, capture_output=True, timeout=30)


class Relay(threading.Thread):
    """Forwards TCP connections accepted on ``address`` to ``target``, byte for byte."""

    def __init__(self, address: str, target: tuple[str, int]) -> None:
        super().__init__(name="partition-relay", daemon=True)
        self.target = target
        self.listener = socket.create_server((address, 0))
        self.listener.settimeout(0.2)
        self.port = self.listener.getsockname()[1]
        self.closing = threading.Event()
        self.sockets: list[socket.socket] = []

    def run(self) -> None:
        while not self.closing.is_set():
            try:
                client, _ = self.listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            server = socket.create_connection(self.target)
            self.sockets += [client, server]
            for source, sink in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(source, sink), daemon=True).start()

    @staticmethod
    def _pump(source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
            sink.shutdown(socket.SHUT_WR)
        except OSError:
            for sock in (source, sink):
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        self.closing.set()
        self.listener.close()
        for sock in self.sockets:
            # A shutdown first: closing alone would not wake a pump blocked in
            # recv, and the connection (and its server session) would stay.
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()


class Namespace:
    """A network namespace with a veth link to this one, and a relay to the test server."""

    def __init__(self) -> None:
        tag = os.getpid() % 100000
        self.name = f"rdbtasks-part-{tag}"
        self.outside_link, self.inside_link = f"rdbp{tag}o", f"rdbp{tag}i"
        octet = tag % 250 + 1
        self.outside, self.inside = f"10.231.{octet}.1", f"10.231.{octet}.2"
        self.relay: Relay | None = None

    def __enter__(self) -> Namespace:
        self._delete()  # left over by a run that was killed
        try:
            _run("ip", "netns", "add", self.name)
            _run(
                "ip",
                "link",
                "add",
                self.outside_link,
                "type",
                "veth",
                "peer",
                "name",
                self.inside_link,
            )
            _run("ip", "link", "set", self.inside_link, "netns", self.name)
            _run("ip", "addr", "add", f"{self.outside}/30", "dev", self.outside_link)
            _run("ip", "link", "set", self.outside_link, "up")
            self.inside_run("ip", "addr", "add", f"{self.inside}/30", "dev", self.inside_link)
            self.inside_run("ip", "link", "set", self.inside_link, "up")
            self.inside_run("ip", "link", "set", "lo", "up")
            settings = connection.settings_dict
            target = (settings["HOST"] or "127.0.0.1", int(settings["PORT"] or 5432))
            self.relay = Relay(self.outside, target)
            self.relay.start()
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        if self.relay is not None:
            self.relay.close()
        self._delete()

    def _delete(self) -> None:
        # Deleting the namespace deletes its iptables rules and its end of the
        # veth pair, which takes the other end with it.
        subprocess.run(["ip", "netns", "delete", self.name], capture_output=True)
        subprocess.run(["ip", "link", "delete", self.outside_link], capture_output=True)

    def inside_run(self, *command: str) -> None:
        _run("ip", "netns", "exec", self.name, *command)

    @property
    def prefix(self) -> list[str]:
        return ["ip", "netns", "exec", self.name]

    def database_url(self) -> str:
        assert self.relay is not None
        settings = connection.settings_dict
        password = f":{settings['PASSWORD']}" if settings["PASSWORD"] else ""
        return f"postgres://{settings['USER']}{password}@{self.outside}:{self.relay.port}/x"

    def cut(self) -> None:
        """Drop every packet between the namespace and the server, silently."""
        self.inside_run("iptables", "-I", "OUTPUT", "-d", self.outside, "-j", "DROP")
        self.inside_run("iptables", "-I", "INPUT", "-s", self.outside, "-j", "DROP")

    def link_down(self) -> None:
        """Take the namespace's link down: its route is gone, nothing is sent or reset."""
        self.inside_run("ip", "link", "set", self.inside_link, "down")

    def heal(self) -> None:
        self.inside_run("iptables", "-D", "OUTPUT", "-d", self.outside, "-j", "DROP")
        self.inside_run("iptables", "-D", "INPUT", "-s", self.outside, "-j", "DROP")


@pytest.fixture
def namespace() -> Iterator[Namespace]:
    reason = _unavailable()
    if reason:
        pytest.skip(reason)
    with Namespace() as ns:
        yield ns


def _ended(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in {"Z", "X"}
    except (OSError, IndexError):
        return True


def _start_cut_off_worker(
    run_workers: Callable[..., WorkerProcess], ns: Namespace, *args: str
) -> tuple[WorkerProcess, int]:
    worker = run_workers(
        "--processes", "1", "--threads", "1", "--no-scheduler", *args,
        prefix=ns.prefix,
        env={"DATABASE_URL": ns.database_url()},
    )  # fmt: skip
    child = wait_until(lambda: worker_children(worker.pid), timeout=30)[0]
    return worker, child


def _log_has(worker: WorkerProcess, text: str) -> bool:
    return text in worker.log()


@pytest.mark.parametrize("cut", ["silent drop", "link down"])
def test_a_worker_cut_off_notices_in_time_and_stops_within_its_grace(
    namespace: Namespace, run_workers: Callable[..., WorkerProcess], cut: str
) -> None:
    lease, grace = 6.0, 6.0
    worker, child = _start_cut_off_worker(
        run_workers, namespace, "--lease", str(lease), "--grace", str(grace)
    )
    # A task that ignores the stop: only the end of the grace ends it.
    result = tasks.record_then_sleep.enqueue("cut-off", 60)
    wait_until(lambda: SideEffect.objects.filter(key="cut-off").exists(), timeout=30)
    if cut == "silent drop":
        namespace.cut()
    else:
        namespace.link_down()
    cut_at = time.monotonic()
    noticed_at = signalled_at = None
    while noticed_at is None or signalled_at is None:
        now = time.monotonic()
        if noticed_at is None and _log_has(worker, "lease renewal failed"):
            noticed_at = now
        if signalled_at is None and now - cut_at >= 3.0:
            worker.signal(signal.SIGTERM)
            signalled_at = time.monotonic()
        if now - cut_at > lease / 3 + 2.0 + 1.0:
            break
        time.sleep(0.05)
    assert noticed_at is not None and noticed_at - cut_at <= lease / 3 + 2.0, worker.log()
    assert signalled_at is not None
    wait_until(lambda: _ended(child), timeout=grace + 10)
    stopped_in = time.monotonic() - signalled_at
    assert stopped_in <= grace + 2.0, (stopped_in, worker.log())
    assert "grace period over" in worker.log()
    # The supervisor cannot mark the registration stopped either: one
    # connection timeout (2 s at this lease) more, not one per attempt.
    worker.wait(timeout=10)
    assert time.monotonic() - signalled_at <= grace + 2.0 + 3.0, worker.log()
    # Nothing could be written: the claim is left to its lease.
    assert Task.objects.get(pk=result.id).status == TaskStatus.RUNNING


def test_a_worker_cut_off_recovers_after_the_heal_and_writes_nothing_stale(
    namespace: Namespace, run_workers: Callable[..., WorkerProcess]
) -> None:
    lease = 3.0
    cut_off, cut_off_child = _start_cut_off_worker(run_workers, namespace, "--lease", str(lease))
    result = tasks.record_then_sleep.enqueue("healed", 4)
    wait_until(lambda: SideEffect.objects.filter(key="healed").exists(), timeout=30)
    namespace.cut()
    # Another worker, connected, takes the task over once the lease runs out.
    other = run_workers(
        "--processes", "1", "--threads", "1", "--no-scheduler", "--lease", str(lease)
    )  # fmt: skip
    wait_until(lambda: SideEffect.objects.filter(key="healed").count() == 2, timeout=30)
    # The first holder's task ends meanwhile: its result waits for the link.
    time.sleep(2.0)
    namespace.heal()
    row = wait_until(
        lambda: Task.objects.filter(pk=result.id, status=TaskStatus.SUCCESSFUL).first(),
        timeout=30,
    )
    other_child = worker_children(other.pid)[0]
    host = socket.gethostname()
    assert row.worker_id.startswith(f"{host}:{other_child}:"), row.worker_id
    assert [entry["outcome"] for entry in row.history] == [
        AttemptOutcome.LOST,
        AttemptOutcome.SUCCESSFUL,
    ]
    assert row.history[0]["worker_id"].startswith(f"{host}:{cut_off_child}:")
    # The late holder was told no, and wrote nothing over the new holder's result.
    wait_until(lambda: _log_has(cut_off, "lease lost") or _log_has(cut_off, "discarded"))
    later = Task.objects.get(pk=result.id)
    assert (later.version, later.history, later.worker_id) == (
        row.version,
        row.history,
        row.worker_id,
    )
    # It recovered alone: with the other worker gone, it runs the next task.
    other.signal(signal.SIGTERM)
    assert other.wait(timeout=20) == 0
    after = tasks.record.enqueue("after-heal")
    wait_until(
        lambda: Task.objects.filter(pk=after.id, status=TaskStatus.SUCCESSFUL).exists(),
        timeout=30,
    )
    assert SideEffect.objects.get(key="after-heal").pid == cut_off_child
    assert not _ended(cut_off_child)


def test_a_worker_started_while_cut_off_stops_at_once_when_told(
    namespace: Namespace, run_workers: Callable[..., WorkerProcess]
) -> None:
    namespace.cut()
    # A connection attempt gives up after 4 s only (lease / 3).
    worker = run_workers(
        "--processes", "1", "--threads", "1", "--no-scheduler", "--lease", "12",
        prefix=namespace.prefix,
        env={"DATABASE_URL": namespace.database_url()},
    )  # fmt: skip
    # The supervisor's own wait for the tables gives up first (one connection timeout).
    child = wait_until(lambda: worker_children(worker.pid), timeout=30)[0]
    time.sleep(1.0)  # registering, blocked
    assert not _ended(child)
    worker.signal(signal.SIGTERM)
    signalled_at = time.monotonic()
    wait_until(lambda: _ended(child), timeout=15)
    assert time.monotonic() - signalled_at <= 2.0, worker.log()


def test_the_namespace_is_gone_after_a_test(namespace: Namespace) -> None:
    name = namespace.name
    namespace.__exit__()
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert name not in listed.split()
