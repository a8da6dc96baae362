"""A PostgreSQL 15 primary and its synchronous standby on local ports.

For the failover test (``tests/test_failover.py``) and for trying a failover by
hand::

    python scripts/clusters/pg_pair.py start /tmp/pair      # primary :25432, standby :25433
    python scripts/clusters/pg_pair.py status /tmp/pair
    python scripts/clusters/pg_pair.py kill-primary /tmp/pair
    python scripts/clusters/pg_pair.py promote /tmp/pair    # the standby becomes the primary
    python scripts/clusters/pg_pair.py stop /tmp/pair       # stops both, removes the directory

From Python, ``start(root, primary_port=..., standby_port=..., extra_conf=...)``
starts a pair on other ports with more settings (``tests/test_replica.py``:
27432/27433 with ``pg_stat_statements``); the command line's pair is the
default one.

Plain streaming replication: ``initdb`` for the primary, ``pg_basebackup -R``
for the standby, ``synchronous_standby_names`` naming the standby on the
primary only (so a commit is acknowledged once the standby has flushed it, and
the promoted standby does not wait for a standby of its own that does not
exist). Trust authentication on 127.0.0.1; ``fsync`` is off for speed, which
only matters if the machine itself crashes. The servers refuse to run as root:
as root every server binary runs as the ``postgres`` OS user (``runuser``).
"""

from __future__ import annotations

import argparse
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

BIN = Path(os.environ.get("PG_BIN", "/usr/lib/postgresql/15/bin"))
# Below Linux's ephemeral range (32768-60999): no outgoing connection holds them.
PRIMARY_PORT = 25432
STANDBY_PORT = 25433
#: The standby's ``application_name``, which ``synchronous_standby_names`` names.
STANDBY_NAME = "rdbtasks_standby"
SERVER_USER = "postgres"


class PairError(RuntimeError):
    """The pair could not be started, promoted or reached."""


@dataclass(frozen=True)
class Pair:
    root: Path
    primary_port: int = PRIMARY_PORT
    standby_port: int = STANDBY_PORT

    @property
    def primary(self) -> Path:
        return self.root / "primary"

    @property
    def standby(self) -> Path:
        return self.root / "standby"

    def data_dir(self, port: int) -> Path:
        return self.primary if port == self.primary_port else self.standby

    def log_file(self, port: int) -> Path:
        return self.root / f"{self.data_dir(port).name}.log"

    @property
    def hosts(self) -> str:
        return "127.0.0.1,127.0.0.1"

    @property
    def ports(self) -> str:
        return f"{self.primary_port},{self.standby_port}"

    def conninfo(self, dbname: str = "postgres") -> str:
        """libpq's multi-host form: whichever of the two accepts writes."""
        return (
            f"host={self.hosts} port={self.ports} user={SERVER_USER} dbname={dbname} "
            "target_session_attrs=read-write connect_timeout=2"
        )


def _as_server_user(args: list[str]) -> list[str]:
    # PostgreSQL refuses to run as root; as anyone else it runs as that user.
    if os.geteuid() == 0:
        return ["runuser", "-u", SERVER_USER, "--", *args]
    return args


def _run(args: list[str], what: str, timeout: float = 120) -> str:
    proc = subprocess.run(
        _as_server_user(args), capture_output=True, text=True, timeout=timeout, check=False
    )
    if proc.returncode != 0:
        raise PairError(f"{what} failed ({proc.returncode}): {proc.stderr.strip() or proc.stdout}")
    return proc.stdout


def psql(port: int, sql: str, dbname: str = "postgres", timeout: float = 30) -> str:
    """Run ``sql`` on the server at ``port``; its unaligned output."""
    args = [str(BIN / "psql"), "-X", "-At", "-h", "127.0.0.1", "-p", str(port)]
    args += ["-U", SERVER_USER, "-d", dbname, "-v", "ON_ERROR_STOP=1", "-c", sql]
    proc = subprocess.run(args, capture_output=True, text=True, timeout=timeout, check=False)
    if proc.returncode != 0:
        raise PairError(f"psql on port {port} failed: {proc.stderr.strip()}")
    return proc.stdout.strip()


def port_in_use(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def _wait(predicate, what: str, timeout: float) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while True:
        try:
            if predicate():
                return
        except PairError:
            pass
        if time.monotonic() > deadline:
            raise PairError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(0.1)


def _server_conf(pair: Pair, port: int, extra: str = "") -> str:
    return f"""
# scripts/clusters/pg_pair.py
port = {port}
listen_addresses = '127.0.0.1'
unix_socket_directories = '{pair.root}'
max_connections = 200
wal_level = replica
max_wal_senders = 5
wal_keep_size = '256MB'
hot_standby = on
synchronous_commit = on
fsync = off
full_page_writes = off
shared_buffers = '64MB'
{extra}
"""


def _pg_ctl_start(pair: Pair, port: int) -> None:
    data = pair.data_dir(port)
    _run(
        [
            str(BIN / "pg_ctl"),
            "-D",
            str(data),
            "-l",
            str(pair.log_file(port)),
            "-w",
            "-t",
            "60",
            "start",
        ],
        f"starting the server on port {port} (log: {pair.log_file(port)})",
    )


def start(
    root: Path | str,
    *,
    primary_port: int = PRIMARY_PORT,
    standby_port: int = STANDBY_PORT,
    extra_conf: str = "",
) -> Pair:
    """Create and start the pair under ``root``; returns once the standby is synchronous.

    ``extra_conf``: more ``postgresql.conf`` lines for both servers (a later
    line wins, so it may override the settings above).
    """
    pair = Pair(Path(root), primary_port, standby_port)
    for port in (pair.primary_port, pair.standby_port):
        if port_in_use(port):
            raise PairError(
                f"port {port} is already in use (a pair left running? "
                f"python scripts/clusters/pg_pair.py stop DIR)"
            )
    if not (BIN / "initdb").exists():
        raise PairError(f"no PostgreSQL binaries in {BIN} (apt-get install postgresql-15)")
    pair.root.mkdir(parents=True, exist_ok=True)
    if os.geteuid() == 0:
        user = pwd.getpwnam(SERVER_USER)
        os.chown(pair.root, user.pw_uid, user.pw_gid)
    pair.root.chmod(0o700)

    _run(
        [
            str(BIN / "initdb"),
            "-D",
            str(pair.primary),
            "-U",
            SERVER_USER,
            "-A",
            "trust",
            "-E",
            "UTF8",
            "--locale=C",
            "--no-sync",
        ],
        "initdb",
    )
    _append(pair.primary / "postgresql.conf", _server_conf(pair, pair.primary_port, extra_conf))
    _pg_ctl_start(pair, pair.primary_port)

    _run(
        [
            str(BIN / "pg_basebackup"),
            "-h",
            "127.0.0.1",
            "-p",
            str(pair.primary_port),
            "-U",
            SERVER_USER,
            "-D",
            str(pair.standby),
            "-R",
            "-X",
            "stream",
            "-c",
            "fast",
            "--no-sync",
        ],
        "pg_basebackup",
    )
    # The copied postgresql.conf names the primary's port; the later line wins.
    # The standby names itself so the primary can wait for it, and waits for
    # no standby of its own once promoted (the primary's setting is made
    # below, after the copy, so it is not inherited).
    _append(pair.standby / "postgresql.conf", _server_conf(pair, pair.standby_port, extra_conf))
    _append(
        pair.standby / "postgresql.auto.conf",
        f"primary_conninfo = 'host=127.0.0.1 port={pair.primary_port} user={SERVER_USER} "
        f"application_name={STANDBY_NAME}'\nsynchronous_standby_names = ''\n",
    )
    _pg_ctl_start(pair, pair.standby_port)

    psql(pair.primary_port, f"ALTER SYSTEM SET synchronous_standby_names = '\"{STANDBY_NAME}\"'")
    psql(pair.primary_port, "SELECT pg_reload_conf()")
    _wait(
        lambda: (
            psql(
                pair.primary_port,
                "SELECT sync_state FROM pg_stat_replication "
                f"WHERE application_name = '{STANDBY_NAME}' AND state = 'streaming'",
            )
            == "sync"
        ),
        "the standby to stream synchronously",
        timeout=60,
    )
    return pair


def _append(path: Path, text: str) -> None:
    # Written as root into the server user's directory: the file keeps its owner.
    with open(path, "a") as handle:
        handle.write(text)


def _postmaster_pid(data: Path) -> int | None:
    try:
        return int((data / "postmaster.pid").read_text().split("\n", 1)[0])
    except (FileNotFoundError, ValueError):
        return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _children(pid: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


def kill_server(data: Path) -> None:
    """SIGKILL the postmaster and every backend at once, as a crashed machine would.

    The postmaster is stopped first so it starts no new child while its
    children are listed; the kernel then closes every client socket.
    """
    pid = _postmaster_pid(data)
    if pid is None or not _alive(pid):
        return
    os.kill(pid, signal.SIGSTOP)
    for child in _children(pid):
        try:
            os.kill(child, signal.SIGKILL)
        except ProcessLookupError:
            pass
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)


def kill_primary(root: Path | str) -> None:
    data = Pair(Path(root)).primary
    pid = _postmaster_pid(data)
    if pid is None or not _alive(pid):
        raise PairError(f"no primary runs from {data}")
    kill_server(data)


def promote(root: Path | str) -> None:
    """Promote the standby; returns once it accepts writes."""
    pair = Pair(Path(root))
    _run([str(BIN / "pg_ctl"), "-D", str(pair.standby), "-w", "-t", "60", "promote"], "promote")
    _wait(
        lambda: psql(pair.standby_port, "SELECT pg_is_in_recovery()") == "f",
        "the promoted standby to accept writes",
        timeout=60,
    )


def stop(root: Path | str, *, remove: bool = True) -> None:
    """Stop whatever of the pair still runs (immediately) and remove ``root``."""
    pair = Pair(Path(root))
    for data in (pair.primary, pair.standby):
        pid = _postmaster_pid(data)
        if pid is None or not _alive(pid):
            continue
        try:
            _run(
                [str(BIN / "pg_ctl"), "-D", str(data), "-m", "immediate", "-w", "stop"],
                "pg_ctl stop",
                timeout=30,
            )
        except (PairError, subprocess.TimeoutExpired):
            kill_server(data)
    if remove:
        shutil.rmtree(pair.root, ignore_errors=True)


def status(root: Path | str) -> str:
    pair = Pair(Path(root))
    lines = []
    for port in (pair.primary_port, pair.standby_port):
        try:
            role = "standby" if psql(port, "SELECT pg_is_in_recovery()") == "t" else "primary"
        except PairError:
            role = "down"
        lines.append(f"{pair.data_dir(port).name} :{port} {role}")
    lines.append(f"conninfo: {pair.conninfo()}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=["start", "status", "kill-primary", "promote", "stop"])
    parser.add_argument("directory", type=Path)
    parser.add_argument("--keep", action="store_true", help="stop: keep the data directories")
    args = parser.parse_args(argv)
    try:
        if args.command == "start":
            start(args.directory)
        elif args.command == "kill-primary":
            kill_primary(args.directory)
        elif args.command == "promote":
            promote(args.directory)
        elif args.command == "stop":
            stop(args.directory, remove=not args.keep)
            return 0
        print(status(args.directory))
    except PairError as exc:
        print(f"pg_pair: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
