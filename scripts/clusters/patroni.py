"""A three-member Patroni cluster (PostgreSQL 15, etcd) behind HAProxy, on local ports.

For ``tests/test_patroni.py`` and for trying Patroni by hand::

    python -m scripts.clusters.patroni start /tmp/patroni          # synchronous mode on
    python -m scripts.clusters.patroni start /tmp/patroni --async  # synchronous mode off
    python -m scripts.clusters.patroni status /tmp/patroni
    python -m scripts.clusters.patroni kill-leader /tmp/patroni    # SIGKILL its PostgreSQL
    python -m scripts.clusters.patroni switchover /tmp/patroni
    python -m scripts.clusters.patroni stop /tmp/patroni           # stops all, removes the dir

Debian's ``patroni``, ``etcd-server`` and ``haproxy`` with PostgreSQL 15 from
``/usr/lib/postgresql/15/bin``. One etcd node (26379), three members
``m1``-``m3`` (PostgreSQL 26432-26434, Patroni's REST API 26008-26010), and
HAProxy: 26000 reaches the primary (the member whose ``/primary`` answers 200),
26001 the replicas. The configuration files are ``deploy/patroni/patroni.yml``
and ``deploy/patroni/haproxy.cfg`` with their ``${...}`` filled in. PostgreSQL
refuses to run as root: as root, Patroni runs as the ``postgres`` OS user.
"""

from __future__ import annotations

import argparse
import json
import os
import pwd
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from string import Template
from typing import Any

from scripts.clusters.pg_pair import BIN, SERVER_USER, PairError, kill_server, port_in_use, psql

DEPLOY = Path(__file__).resolve().parent.parent.parent / "deploy" / "patroni"
SCOPE = "rdbtasks"
ETCD_PORT = 26379
ETCD_PEER_PORT = 26380
RW_PORT = 26000
RO_PORT = 26001
NAMES = ("m1", "m2", "m3")
PG_PORTS = (26432, 26433, 26434)
REST_PORTS = (26008, 26009, 26010)
#: A replica this far behind (bytes) still counts as caught up: maximum_lag_on_failover.
MAX_LAG = 1048576


class PatroniError(RuntimeError):
    """The cluster could not be started, changed or reached."""


@dataclass(frozen=True)
class Member:
    name: str
    pg_port: int
    rest_port: int
    root: Path

    @property
    def data_dir(self) -> Path:
        return self.root / self.name

    @property
    def config(self) -> Path:
        return self.root / f"{self.name}.yml"

    @property
    def log(self) -> Path:
        return self.root / f"{self.name}.log"

    @property
    def pid_file(self) -> Path:
        return self.root / f"{self.name}.pid"


@dataclass(frozen=True)
class Cluster:
    root: Path

    @property
    def members(self) -> list[Member]:
        return [Member(*each, self.root) for each in zip(NAMES, PG_PORTS, REST_PORTS, strict=True)]

    def member(self, name: str) -> Member:
        return next(member for member in self.members if member.name == name)

    def url(self, dbname: str) -> str:
        """HAProxy's read-write address: one host, whichever member is the primary."""
        return f"postgres://{SERVER_USER}@127.0.0.1:{RW_PORT}/{dbname}"

    def multi_host_url(self, dbname: str) -> str:
        """libpq's multi-host form: every member, the first that accepts writes."""
        hosts = ",".join(f"127.0.0.1:{port}" for port in PG_PORTS)
        return (
            f"postgres://{SERVER_USER}@{hosts}/{dbname}"
            "?target_session_attrs=read-write&connect_timeout=2"
        )

    def members_state(self) -> list[dict[str, Any]]:
        """Patroni's view (``GET /cluster`` of any member that answers)."""
        for member in self.members:
            try:
                with urllib.request.urlopen(
                    f"http://127.0.0.1:{member.rest_port}/cluster", timeout=1
                ) as response:
                    return list(json.load(response)["members"])
            except (OSError, ValueError, KeyError):
                continue
        raise PatroniError("no member's REST API answers")

    def leader(self) -> str | None:
        for state in self.members_state():
            if state.get("role") == "leader" and state.get("state") == "running":
                return str(state["name"])
        return None


def _server_user() -> dict[str, Any]:
    if os.geteuid() != 0:
        return {}
    return {"user": SERVER_USER, "group": SERVER_USER, "extra_groups": []}


def _fill(template: str, **values: object) -> str:
    return Template((DEPLOY / template).read_text()).substitute(
        {key: str(value) for key, value in values.items()}
    )


def _wait(predicate, what: str, timeout: float) -> Any:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = predicate()
            if value:
                return value
        except PatroniError:
            pass
        if time.monotonic() > deadline:
            raise PatroniError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(0.2)


def _spawn(args: list[str], log: Path, pid_file: Path, **kwargs: Any) -> int:
    with open(log, "ab") as out:
        process = subprocess.Popen(
            args, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, **kwargs
        )
    pid_file.write_text(str(process.pid))
    return process.pid


def _pid(path: Path) -> int | None:
    try:
        pid = int(path.read_text().split("\n", 1)[0])
    except (FileNotFoundError, ValueError):
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    return pid


def start(root: Path | str, *, synchronous: bool = True) -> Cluster:
    """Start etcd, the three members and HAProxy; returns once every replica streams."""
    cluster = Cluster(Path(root))
    ports = (ETCD_PORT, ETCD_PEER_PORT, RW_PORT, RO_PORT, *PG_PORTS, *REST_PORTS)
    for port in ports:
        if port_in_use(port):
            raise PatroniError(
                f"port {port} is already in use (a cluster left running? "
                "python -m scripts.clusters.patroni stop DIR)"
            )
    for tool in ("patroni", "etcd", "haproxy"):
        if shutil.which(tool) is None and not Path("/usr/sbin", tool).exists():
            raise PatroniError(
                f"{tool} is not installed (apt-get install patroni etcd-server haproxy)"
            )
    if not (BIN / "initdb").exists():
        raise PatroniError(f"no PostgreSQL binaries in {BIN} (apt-get install postgresql-15)")
    cluster.root.mkdir(parents=True, exist_ok=True)
    if os.geteuid() == 0:
        user = pwd.getpwnam(SERVER_USER)
        os.chown(cluster.root, user.pw_uid, user.pw_gid)
    cluster.root.chmod(0o700)

    _spawn(
        [
            "etcd", "--name", "e1", "--data-dir", str(cluster.root / "etcd"),
            "--listen-client-urls", f"http://127.0.0.1:{ETCD_PORT}",
            "--advertise-client-urls", f"http://127.0.0.1:{ETCD_PORT}",
            "--listen-peer-urls", f"http://127.0.0.1:{ETCD_PEER_PORT}",
            "--initial-advertise-peer-urls", f"http://127.0.0.1:{ETCD_PEER_PORT}",
            "--initial-cluster", f"e1=http://127.0.0.1:{ETCD_PEER_PORT}",
        ],
        cluster.root / "etcd.log",
        cluster.root / "etcd.pid",
        **_server_user(),
    )  # fmt: skip
    _wait(lambda: port_in_use(ETCD_PORT), "etcd", timeout=30)

    for member in cluster.members:
        member.config.write_text(
            _fill(
                "patroni.yml",
                scope=SCOPE,
                name=member.name,
                rest_port=member.rest_port,
                etcd_hosts=f"127.0.0.1:{ETCD_PORT}",
                synchronous_mode="true" if synchronous else "false",
                pg_port=member.pg_port,
                data_dir=member.data_dir,
                bin_dir=BIN,
                socket_dir=cluster.root,
            )
        )
    # The first member bootstraps (initdb); the others copy it (pg_basebackup).
    first, *others = cluster.members
    start_member(cluster, first.name)
    _wait(lambda: cluster.leader() == first.name, "the first member to lead", timeout=60)
    for member in others:
        start_member(cluster, member.name)
    wait_healthy(cluster, timeout=120)

    servers = "\n".join(
        f"    server {m.name} 127.0.0.1:{m.pg_port} maxconn 300 check port {m.rest_port}"
        for m in cluster.members
    )
    (cluster.root / "haproxy.cfg").write_text(
        _fill(
            "haproxy.cfg",
            bind="127.0.0.1",
            rw_port=RW_PORT,
            ro_port=RO_PORT,
            primary_servers=servers,
            replica_servers=servers,
        )
    )
    haproxy = shutil.which("haproxy") or "/usr/sbin/haproxy"
    _spawn(
        [haproxy, "-db", "-f", str(cluster.root / "haproxy.cfg")],
        cluster.root / "haproxy.log",
        cluster.root / "haproxy.pid",
    )
    _wait(lambda: port_in_use(RW_PORT), "HAProxy", timeout=30)
    # HAProxy starts with every server up, until their checks fail: wait
    # until its read-write port reaches the primary only, its read-only
    # port the replicas only.
    _wait(lambda: _reaches_only(RW_PORT, primary=True), "HAProxy's read-write checks", 30)
    _wait(lambda: _reaches_only(RO_PORT, primary=False), "HAProxy's read-only checks", 30)
    return cluster


def _reaches_only(port: int, *, primary: bool) -> bool:
    for _ in range(2 * len(NAMES)):  # round robin: every server's turn, twice
        try:
            in_recovery = psql(port, "SELECT pg_is_in_recovery()", timeout=5) == "t"
        except PairError:
            return False
        if in_recovery == primary:
            return False
    return True


def start_member(cluster: Cluster, name: str) -> None:
    member = cluster.member(name)
    patroni = shutil.which("patroni") or "/usr/bin/patroni"
    _spawn([patroni, str(member.config)], member.log, member.pid_file, **_server_user())


def wait_healthy(cluster: Cluster, timeout: float = 120, synchronous: bool | None = None) -> str:
    """Wait for one running leader and every other member streaming from it; the leader's name.

    With ``synchronous`` (default: what the cluster was started with), one of
    them must also be the synchronous standby.
    """

    def healthy() -> str | None:
        states = cluster.members_state()
        leaders = [s for s in states if s.get("role") == "leader" and s.get("state") == "running"]
        if len(states) != len(NAMES) or len(leaders) != 1:
            return None
        timeline = leaders[0].get("timeline")
        replicas = [s for s in states if s is not leaders[0]]
        for state in replicas:
            if state.get("state") not in ("running", "streaming"):
                return None
            # Streaming on the leader's timeline, close behind (it may be
            # under load: a lag of exactly 0 is not to be waited for).
            lag = state.get("lag")
            if state.get("timeline") != timeline or not isinstance(lag, int) or lag > MAX_LAG:
                return None
        sync = synchronous if synchronous is not None else is_synchronous(cluster)
        if sync and not any(s.get("role") == "sync_standby" for s in replicas):
            return None
        return str(leaders[0]["name"])

    return str(_wait(healthy, "a leader and two streaming replicas", timeout))


def is_synchronous(cluster: Cluster) -> bool:
    """Synchronous mode as the cluster has it now (``GET /config``: it may have been patched)."""
    for member in cluster.members:
        try:
            with urllib.request.urlopen(
                f"http://127.0.0.1:{member.rest_port}/config", timeout=1
            ) as response:
                return bool(json.load(response).get("synchronous_mode"))
        except (OSError, ValueError):
            continue
    raise PatroniError("no member's REST API answers")


def _postmaster(member: Member) -> int | None:
    return _pid(member.data_dir / "postmaster.pid")


def kill_leader(cluster: Cluster) -> str:
    """SIGKILL the leader's PostgreSQL with all its backends (Patroni lives on); its name."""
    leader = cluster.leader()
    if leader is None:
        raise PatroniError("no leader")
    kill_server(cluster.member(leader).data_dir)
    return leader


def _processes(member: Member) -> list[int]:
    """The member's Patroni and its PostgreSQL server processes."""
    pids = [pid for pid in (_pid(member.pid_file), _postmaster(member)) if pid is not None]
    postmaster = _postmaster(member)
    if postmaster is not None:
        out = subprocess.run(["pgrep", "-P", str(postmaster)], capture_output=True, text=True)
        pids += [int(pid) for pid in out.stdout.split()]
    return pids


def freeze(cluster: Cluster, name: str) -> None:
    """SIGSTOP a member whole (Patroni and PostgreSQL): a machine that stalled.

    Its sockets stay open and the kernel still acknowledges what is sent to
    them, but nothing answers: connections to it are half-open.
    """
    pids = _processes(cluster.member(name))
    postmaster = _postmaster(cluster.member(name))
    if postmaster is not None:  # first, so it starts no new child meanwhile
        os.kill(postmaster, signal.SIGSTOP)
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)


def thaw(cluster: Cluster, name: str) -> None:
    for pid in _processes(cluster.member(name)):
        os.kill(pid, signal.SIGCONT)


def stop_member(cluster: Cluster, name: str) -> None:
    """SIGKILL a member whole (Patroni and PostgreSQL), frozen or not: a machine reset.

    ``start_member`` brings it back; Patroni makes it a replica of whoever
    leads then (``pg_rewind`` if it had diverged).
    """
    member = cluster.member(name)
    patroni = _pid(member.pid_file)
    if patroni is not None:
        os.kill(patroni, signal.SIGKILL)
    pids = _processes(member)
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    _wait(lambda: not any(_alive(pid) for pid in pids), f"{name} to die", timeout=10)


def _alive(pid: int) -> bool:
    try:  # a child of ours (Patroni) is a zombie until reaped
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def switchover(cluster: Cluster, candidate: str | None = None) -> str:
    """``patronictl switchover`` to ``candidate`` (default: a healthy replica); the new leader."""
    leader = cluster.leader()
    if leader is None:
        raise PatroniError("no leader to switch over from")
    if candidate is None:
        states = cluster.members_state()
        roles = {s["name"]: s.get("role") for s in states}
        candidate = (
            next(name for name in NAMES if name != leader and roles.get(name) == "sync_standby")
            if "sync_standby" in roles.values()
            else next(n for n in NAMES if n != leader)
        )
    patronictl = shutil.which("patronictl") or "/usr/bin/patronictl"
    proc = subprocess.run(
        [
            patronictl, "-c", str(cluster.member(leader).config), "switchover",
            "--leader", leader, "--candidate", candidate, "--force",
        ],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    if proc.returncode != 0 or "failed" in proc.stdout.lower():
        raise PatroniError(f"switchover failed: {proc.stdout}{proc.stderr}")
    _wait(lambda: cluster.leader() == candidate, f"{candidate} to lead", timeout=60)
    return candidate


def stop(root: Path | str, *, remove: bool = True) -> None:
    """Stop HAProxy, the members, their PostgreSQL and etcd; remove ``root``."""
    cluster = Cluster(Path(root))
    haproxy = _pid(cluster.root / "haproxy.pid")
    if haproxy is not None:
        os.kill(haproxy, signal.SIGKILL)
    for member in cluster.members:
        # A frozen member first comes back, then everything of it is killed.
        for pid in _processes(member):
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
        patroni = _pid(member.pid_file)
        if patroni is not None:
            os.kill(patroni, signal.SIGKILL)
        kill_server(member.data_dir)
    etcd = _pid(cluster.root / "etcd.pid")
    if etcd is not None:
        os.kill(etcd, signal.SIGKILL)
    if remove:
        shutil.rmtree(cluster.root, ignore_errors=True)


def status(root: Path | str) -> str:
    cluster = Cluster(Path(root))
    try:
        states = cluster.members_state()
    except PatroniError as exc:
        return str(exc)
    lines = [
        f"{s['name']} :{s.get('port')} {s.get('role')} {s.get('state')} "
        f"timeline {s.get('timeline')} lag {s.get('lag', '')}"
        for s in sorted(states, key=lambda s: str(s["name"]))
    ]
    lines.append(f"read-write: {cluster.url('postgres')}")
    lines.append(f"read-only: postgres://{SERVER_USER}@127.0.0.1:{RO_PORT}/postgres")
    lines.append(f"multi-host: {cluster.multi_host_url('postgres')}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("command", choices=["start", "status", "kill-leader", "switchover", "stop"])
    parser.add_argument("directory", type=Path)
    parser.add_argument(
        "--async", dest="asynchronous", action="store_true", help="start: synchronous mode off"
    )
    parser.add_argument("--keep", action="store_true", help="stop: keep the data directories")
    args = parser.parse_args(argv)
    try:
        if args.command == "start":
            start(args.directory, synchronous=not args.asynchronous)
        elif args.command == "kill-leader":
            print(f"killed {kill_leader(Cluster(args.directory))}'s PostgreSQL")
        elif args.command == "switchover":
            print(f"{switchover(Cluster(args.directory))} leads")
        elif args.command == "stop":
            stop(args.directory, remove=not args.keep)
            return 0
        print(status(args.directory))
    except PatroniError as exc:
        print(f"patroni: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
