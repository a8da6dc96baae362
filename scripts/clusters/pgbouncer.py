"""Run a PgBouncer in transaction pooling mode in front of a PostgreSQL server.

For the tests (``tests/test_pgbouncer.py``) and for trying the workers behind a
pooler by hand::

    python scripts/clusters/pgbouncer.py start /tmp/bouncer --port 6439 --pool-size 4
    DATABASE_URL=postgres://postgres@127.0.0.1:6439/test ...
    python scripts/clusters/pgbouncer.py stop /tmp/bouncer

Every client database name is passed through to the server (``* = ...``), and
every server connection logs in as ``server_user``, so the server's
``pg_stat_activity`` tells the pooler's connections from everyone else's. PgBouncer
refuses to run as root: it runs as the ``postgres`` OS user then, so the
directory must be one that user can reach (not inside root's private ones).
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

BINARY = "/usr/sbin/pgbouncer"


@dataclass(frozen=True)
class Bouncer:
    directory: Path
    port: int
    pool_size: int
    server_user: str

    @property
    def pid_file(self) -> Path:
        return self.directory / "pgbouncer.pid"

    @property
    def log_file(self) -> Path:
        return self.directory / "pgbouncer.log"

    def url(self, database: str, user: str = "postgres") -> str:
        return f"postgres://{user}@127.0.0.1:{self.port}/{database}"


def config(bouncer: Bouncer, server_host: str, server_port: int) -> str:
    return f"""\
[databases]
* = host={server_host} port={server_port} user={bouncer.server_user}

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {bouncer.port}
unix_socket_dir =
auth_type = trust
auth_file = {bouncer.directory}/userlist.txt
admin_users = postgres
stats_users = postgres
pool_mode = transaction
default_pool_size = {bouncer.pool_size}
min_pool_size = 0
reserve_pool_size = 0
max_db_connections = {bouncer.pool_size}
max_client_conn = 1000
; A client waiting for a server connection gets an error after this long
; rather than hanging: the worker retries it like any other database error.
query_wait_timeout = 30
; The pooler's own bound on a transaction left open by a frozen client.
idle_transaction_timeout = 30
server_reset_query =
server_check_delay = 1
logfile = {bouncer.log_file}
pidfile = {bouncer.pid_file}
"""


def start(
    directory: str | os.PathLike[str],
    *,
    port: int = 6439,
    pool_size: int = 4,
    server_host: str = "127.0.0.1",
    server_port: int = 5432,
    server_user: str = "postgres",
    timeout: float = 15.0,
) -> Bouncer:
    """Write the configuration, start PgBouncer as a daemon, wait until it accepts."""
    bouncer = Bouncer(Path(directory).resolve(), port, pool_size, server_user)
    bouncer.directory.mkdir(parents=True, exist_ok=True)
    (bouncer.directory / "userlist.txt").write_text('"postgres" ""\n')
    ini = bouncer.directory / "pgbouncer.ini"
    ini.write_text(config(bouncer, server_host, server_port))
    command = [BINARY, "-d", str(ini)]
    if os.geteuid() == 0:
        shutil.chown(bouncer.directory, "postgres")
        for path in bouncer.directory.iterdir():
            shutil.chown(path, "postgres")
        command = ["runuser", "-u", "postgres", "--", *command]
    if not Path(BINARY).exists():
        raise RuntimeError(f"{BINARY} is missing: apt-get install pgbouncer")
    started = subprocess.run(command, capture_output=True, text=True)
    if started.returncode:
        raise RuntimeError(f"PgBouncer did not start: {started.stderr.strip()}")
    deadline = time.monotonic() + timeout
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return bouncer
        except OSError:
            if time.monotonic() > deadline:
                log = bouncer.log_file.read_text() if bouncer.log_file.exists() else ""
                raise RuntimeError(f"PgBouncer did not listen on {port}:\n{log}") from None
            time.sleep(0.05)


def stop(directory: str | os.PathLike[str], timeout: float = 10.0) -> None:
    """Stop the PgBouncer started in ``directory`` (SIGINT: at once, dropping clients)."""
    pid_file = Path(directory) / "pgbouncer.pid"
    try:
        pid = int(pid_file.read_text())
    except (FileNotFoundError, ValueError):
        return
    try:
        os.kill(pid, signal.SIGINT)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=["start", "stop"])
    parser.add_argument("directory")
    parser.add_argument("--port", type=int, default=6439)
    parser.add_argument("--pool-size", type=int, default=4)
    parser.add_argument("--server-port", type=int, default=5432)
    parser.add_argument("--server-user", default="postgres")
    args = parser.parse_args(argv)
    if args.action == "start":
        bouncer = start(
            args.directory,
            port=args.port,
            pool_size=args.pool_size,
            server_port=args.server_port,
            server_user=args.server_user,
        )
        print(f"PgBouncer (transaction pooling) on {bouncer.url('<database>')}")
    else:
        stop(args.directory)
    return 0


if __name__ == "__main__":
    sys.exit(main())
