"""A three-node MariaDB Galera cluster on local ports, for tests and operators.

    python scripts/clusters/galera.py start DIR   # bootstrap, join, wait until all Synced
    python scripts/clusters/galera.py status DIR
    python scripts/clusters/galera.py stop DIR

Built from Debian's packages only (``mariadb-server``, ``galera-4``,
``rsync``): each node gets its own datadir, socket, pid file, error log and
``my.cnf`` under ``DIR/nodeN``. The first node is initialised with
``mariadb-install-db`` and bootstraps the cluster (``--wsrep-new-cluster``);
the other two join it and receive its data by rsync SST (a fresh datadir of a
few MB copies in a second or two; mariabackup needs a backup user and is
slower). Nothing here reads ``/etc/mysql``: every node starts with
``--defaults-file`` of its own, so the ordinary MariaDB on 3306 is never
touched.

Ports (all on 127.0.0.1): clients 23061-23063, Galera replication
24671-24673, IST 24681-24683, SST 24691-24693. ``root`` connects over TCP
without a password, as on the ordinary test server.

Importable: ``GaleraCluster(base).start()`` / ``.stop()``, ``.url(i, db)``,
``.status(i)``, ``.query(i, sql)``. Only the standard library is used, and
queries go through the ``mariadb`` command-line client, so an operator can run
this with any Python 3.11+.
"""

from __future__ import annotations

import argparse
import functools
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

HOST = "127.0.0.1"
# All below Linux's ephemeral range (32768-60999 by default): an outgoing
# connection (an SST's rsync, a client) can never be holding one of them.
CLIENT_PORTS = (23061, 23062, 23063)
GALERA_PORTS = (24671, 24672, 24673)
IST_PORTS = (24681, 24682, 24683)
SST_PORTS = (24691, 24692, 24693)
PROVIDER = "/usr/lib/galera/libgalera_smm.so"
CLUSTER_NAME = "rdbtasks_test"
#: The account the servers run as when started by root (Debian's package makes it).
SERVER_USER = "mysql"
#: Debian installs the server in /usr/sbin, which is not on every PATH.
SEARCH_PATH = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/usr/bin"])


class ClusterError(RuntimeError):
    """The cluster could not be started (the message says why and where the logs are)."""


@dataclass(frozen=True)
class Node:
    index: int  # 1, 2 or 3
    base: Path

    @property
    def home(self) -> Path:
        return self.base / f"node{self.index}"

    @property
    def datadir(self) -> Path:
        return self.home / "data"

    @property
    def socket(self) -> Path:
        return self.home / "mariadb.sock"

    @property
    def pid_file(self) -> Path:
        return self.home / "mariadb.pid"

    @property
    def error_log(self) -> Path:
        return self.home / "error.log"

    @property
    def cnf(self) -> Path:
        return self.home / "my.cnf"

    @property
    def port(self) -> int:
        return CLIENT_PORTS[self.index - 1]

    def config(self) -> str:
        peers = ",".join(f"{HOST}:{p}" for p in GALERA_PORTS)
        gport, ist, sst = (ports[self.index - 1] for ports in (GALERA_PORTS, IST_PORTS, SST_PORTS))
        provider_options = ";".join(
            [
                f"gmcast.listen_addr=tcp://{HOST}:{gport}",
                f"ist.recv_addr={HOST}:{ist}",
                # The ring buffer is preallocated at start-up: keep it small.
                "gcache.size=32M",
                # Three nodes on one host: a lost node is noticed sooner.
                "evs.suspect_timeout=PT5S",
                "evs.inactive_timeout=PT10S",
            ]
        )
        lines = [
            "[mysqld]",
            f"datadir={self.datadir}",
            f"socket={self.socket}",
            f"pid-file={self.pid_file}",
            f"log-error={self.error_log}",
            f"port={self.port}",
            f"bind-address={HOST}",
            "skip-name-resolve",
            "max_connections=300",
            # Start-up speed over durability: a test cluster is thrown away.
            "innodb_buffer_pool_size=64M",
            "innodb_log_file_size=32M",
            "innodb_flush_log_at_trx_commit=2",
            "performance_schema=OFF",
            # What Galera requires.
            "binlog_format=ROW",
            "default_storage_engine=InnoDB",
            "innodb_autoinc_lock_mode=2",
            "wsrep_on=ON",
            f"wsrep_provider={PROVIDER}",
            f"wsrep_cluster_name={CLUSTER_NAME}",
            f"wsrep_cluster_address=gcomm://{peers}",
            f"wsrep_node_name=node{self.index}",
            f"wsrep_node_address={HOST}:{gport}",
            f"wsrep_node_incoming_address={HOST}:{self.port}",
            "wsrep_sst_method=rsync",
            f"wsrep_sst_receive_address={HOST}:{sst}",
            f'wsrep_provider_options="{provider_options}"',
            "wsrep_slave_threads=2",
        ]
        if os.geteuid() == 0:
            # Not as root: the joiner's rsync daemon (rsync SST) would then
            # write as "nobody" and fail. The files are chowned to mysql.
            lines.append(f"user={SERVER_USER}")
        return "\n".join(lines) + "\n"


class GaleraCluster:
    def __init__(self, base: Path | str) -> None:
        self.base = Path(base).resolve()
        self.nodes = [Node(i, self.base) for i in (1, 2, 3)]
        #: The servers this object started, to notice one dying before it writes a pid file.
        self._processes: dict[int, subprocess.Popen[bytes]] = {}

    # -- for clients --------------------------------------------------------------------

    def url(self, index: int, database: str) -> str:
        """A ``DATABASE_URL`` for node ``index`` (1-3)."""
        return f"mysql://root@{HOST}:{CLIENT_PORTS[index - 1]}/{database}"

    def query(self, index: int, sql: str, *, timeout: float = 30.0) -> list[list[str]]:
        """Rows of ``sql`` run on node ``index`` through its socket, as text."""
        node = self.nodes[index - 1]
        done = subprocess.run(
            [
                _binary("mariadb"),
                "--no-defaults",
                "--user=root",
                f"--socket={node.socket}",
                "--batch",
                "--skip-column-names",
                "-e",
                sql,
            ],
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if done.returncode != 0:
            raise ClusterError(f"node{index}: {sql!r} failed: {done.stderr.strip()}")
        return [line.split("\t") for line in done.stdout.splitlines()]

    def status(self, index: int) -> dict[str, str]:
        """``SHOW GLOBAL STATUS LIKE 'wsrep%'`` of node ``index``."""
        rows = self.query(index, "SHOW GLOBAL STATUS LIKE 'wsrep%'")
        return {row[0]: row[1] for row in rows if len(row) == 2}

    # -- life cycle ---------------------------------------------------------------------

    def running(self) -> list[int]:
        """Pids of this cluster's servers that are alive."""
        return [pid for node in self.nodes if (pid := _alive_pid(node)) is not None]

    def start(self, timeout: float = 120.0) -> None:
        """Bootstrap node 1, join nodes 2 and 3; return once all three are Synced.

        On failure every node this call started is stopped again, and the
        error names the log to read.
        """
        if not Path(PROVIDER).exists():
            raise ClusterError(f"{PROVIDER} is missing: apt-get install galera-4")
        for tool in ("mariadbd", "mariadb-install-db", "mariadb", "rsync"):
            _binary(tool)
        if self.running():
            raise ClusterError(f"a cluster is already running under {self.base}")
        busy = [p for p in (*CLIENT_PORTS, *GALERA_PORTS, *IST_PORTS, *SST_PORTS) if _in_use(p)]
        if busy:
            raise ClusterError(f"ports in use on {HOST}: {busy} (another cluster left running?)")
        for node in self.nodes:
            if node.home.exists():
                shutil.rmtree(node.home)
            node.datadir.mkdir(parents=True)
            node.cnf.write_text(node.config())
        self._hand_to_server_user()
        try:
            self._install(self.nodes[0])
            self._launch(self.nodes[0], bootstrap=True)
            self._wait(lambda: self._synced(1), timeout, "node1 to bootstrap", self.nodes[0])
            # One joiner at a time: each needs a donor for its SST, and a donor
            # serves one SST at a time.
            for node in self.nodes[1:]:
                self._launch(node, bootstrap=False)
                self._wait(
                    functools.partial(self._synced, node.index),
                    timeout,
                    f"node{node.index} to join",
                    node,
                )
            self._wait(
                lambda: all(self._cluster_size(n.index) == 3 for n in self.nodes),
                timeout,
                "a cluster of 3",
                self.nodes[0],
            )
        except BaseException:
            self.stop()
            raise

    def stop(self, timeout: float = 60.0) -> None:
        """Stop every node (SIGTERM, then SIGKILL after ``timeout``); safe to call twice."""
        pids = self.running()
        for pid in pids:
            _signal(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while any(_pid_alive(pid) for pid in pids) and time.monotonic() < deadline:
            time.sleep(0.1)
        for pid in pids:
            if _pid_alive(pid):
                _signal(pid, signal.SIGKILL)
        for pid in pids:
            _reap(pid)
        for process in self._processes.values():
            if process.poll() is None:  # never wrote its pid file
                process.kill()
            process.wait()
        self._processes.clear()

    # -- the steps ----------------------------------------------------------------------

    def _hand_to_server_user(self) -> None:
        """As root, give the tree to ``mysql``, which must also reach it."""
        if os.geteuid() != 0:
            return
        account = pwd.getpwnam(SERVER_USER)
        self.base.chmod(0o755)
        for parent in self.base.parents:
            if not parent.stat().st_mode & 0o001:
                raise ClusterError(
                    f"{parent} is not searchable by others: the servers run as "
                    f"{SERVER_USER} and must reach {self.base}; pick another directory"
                )
        for path in [self.base, *self.base.rglob("*")]:
            os.chown(path, account.pw_uid, account.pw_gid)

    def _install(self, node: Node) -> None:
        done = subprocess.run(
            [
                _binary("mariadb-install-db"),
                f"--defaults-file={node.cnf}",
                # root with no password from any local address, as on the
                # ordinary test server (not unix_socket-only).
                "--auth-root-authentication-method=normal",
                "--skip-test-db",
            ],
            capture_output=True,
            text=True,
            env={**os.environ, "PATH": SEARCH_PATH},
            timeout=120,
        )
        if done.returncode != 0:
            raise ClusterError(
                f"mariadb-install-db failed for node{node.index}:\n{done.stdout}\n{done.stderr}"
            )

    def _launch(self, node: Node, *, bootstrap: bool) -> None:
        args = [_binary("mariadbd"), f"--defaults-file={node.cnf}"]
        if bootstrap:
            args.append("--wsrep-new-cluster")
        with open(node.home / "stdout.log", "ab") as out:
            self._processes[node.index] = subprocess.Popen(
                args,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=node.home,
                # Its own session: outlives this script (``start`` from a
                # shell), and a Ctrl+C in that shell does not reach it.
                start_new_session=True,
                env={**os.environ, "PATH": SEARCH_PATH},
            )

    def _synced(self, index: int) -> bool:
        node = self.nodes[index - 1]
        if not node.socket.exists():
            return False
        try:
            state = self.status(index)
        except (ClusterError, subprocess.TimeoutExpired):
            return False
        synced = state.get("wsrep_local_state_comment") == "Synced"
        return synced and state.get("wsrep_ready") == "ON"

    def _cluster_size(self, index: int) -> int:
        try:
            return int(self.status(index).get("wsrep_cluster_size", "0"))
        except (ClusterError, subprocess.TimeoutExpired, ValueError):
            return 0

    def _wait(self, ready: Callable[[], bool], timeout: float, what: str, node: Node) -> None:
        deadline = time.monotonic() + timeout
        while not ready():
            if not self._started_ok(node):
                raise ClusterError(
                    f"node{node.index} exited while waiting for {what}; see {node.error_log}:\n"
                    + _tail(node.error_log)
                )
            if time.monotonic() > deadline:
                raise ClusterError(
                    f"timed out after {timeout:.0f}s waiting for {what}; see {node.error_log}:\n"
                    + _tail(node.error_log)
                )
            time.sleep(0.2)

    def _started_ok(self, node: Node) -> bool:
        """False once the node's server has died."""
        process = self._processes.get(node.index)
        return process is None or process.poll() is None


# -- process helpers ---------------------------------------------------------------------


def _binary(name: str) -> str:
    found = shutil.which(name, path=SEARCH_PATH)
    if found is None:
        raise ClusterError(f"{name} not found: apt-get install mariadb-server galera-4 rsync")
    return found


def _read_pid(node: Node) -> int | None:
    try:
        return int(node.pid_file.read_text().strip())
    except (FileNotFoundError, ValueError):
        return None


def _alive_pid(node: Node) -> int | None:
    pid = _read_pid(node)
    return pid if pid is not None and _pid_alive(pid) and _is_mariadbd(pid) else None


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie (our own child not yet reaped) is dead for our purposes.
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"
    except (FileNotFoundError, IndexError):
        return False


def _is_mariadbd(pid: int) -> bool:
    # A stale pid file must not make us signal an unrelated process.
    try:
        return "mariadbd" in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except FileNotFoundError:
        return False


def _signal(pid: int, signum: int) -> None:
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        pass


def _reap(pid: int) -> None:
    """Collect the exit status if the server was our child (a test); no zombie left."""
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


def _in_use(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.settimeout(0.5)
        return probe.connect_ex((HOST, port)) == 0


def _tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except FileNotFoundError:
        return "(no log)"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=["start", "stop", "status"])
    parser.add_argument("dir", type=Path, help="where the nodes' datadirs, sockets and logs live")
    options = parser.parse_args(argv)
    cluster = GaleraCluster(options.dir)
    try:
        if options.command == "start":
            started = time.monotonic()
            cluster.start()
            print(f"Galera cluster of 3 Synced in {time.monotonic() - started:.1f}s:")
            for i in (1, 2, 3):
                print(f"  node{i}: {cluster.url(i, '<database>')}")
        elif options.command == "stop":
            cluster.stop()
            print("stopped")
        else:
            for i in (1, 2, 3):
                state = cluster.status(i) if cluster.nodes[i - 1].socket.exists() else {}
                print(
                    f"node{i}: {state.get('wsrep_local_state_comment', 'down')}, "
                    f"cluster size {state.get('wsrep_cluster_size', '-')}"
                )
    except ClusterError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
