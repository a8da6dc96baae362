"""The deploy recipes in deploy/ hold together: the systemd unit stops gracefully
within its timeout (and ``systemd-analyze verify`` accepts it), the Kubernetes
probes are the real commands and pass against a real worker, the grace periods
agree with ``--grace``, and the KEDA query counts the work (PostgreSQL, and
MySQL/MariaDB with their clock)."""

from __future__ import annotations

import configparser
import datetime as dt
import json
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from django.core.management import load_command_class
from django.db import connection

from django_rdbtasks.management.commands.rdbtasks import (
    DEFAULT_HEARTBEAT_WITHIN,
    DEFAULT_PROBE_TIMEOUT,
)
from django_rdbtasks.models import Task
from django_rdbtasks.states import TaskStatus
from tests.browser.support import make_task, now
from tests.conftest import ROOT
from tests.test_probes import probe, start_worker

DEPLOY = ROOT / "deploy"
UNIT = DEPLOY / "systemd" / "rdbtasks-worker.service"
DEPLOYMENT = DEPLOY / "kubernetes" / "worker-deployment.yaml"
SCALEDOBJECT = DEPLOY / "kubernetes" / "keda-scaledobject.yaml"
#: runworkers' default --lease: workers heartbeat every third of it.
DEFAULT_LEASE = 30.0


def runworkers_options(argv: list[str]) -> dict[str, Any]:
    """``argv`` (after ``manage.py runworkers``) as runworkers' own parser reads it."""
    command = load_command_class("django_rdbtasks", "runworkers")
    parser = command.create_parser("manage.py", "runworkers")
    return vars(parser.parse_args(argv))


def after(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


# -- YAML: PyYAML if some Python here has it; else the few values the tests need -----


def load_yaml(path: Path) -> list[dict[str, Any]] | None:
    """Every document of ``path``, or None when no YAML parser is at hand.

    PyYAML is not a dependency; a system Python often has it.
    """
    try:
        import yaml
    except ImportError:
        pass
    else:
        return list(yaml.safe_load_all(path.read_text()))
    for python in ("/usr/bin/python3", "/usr/local/bin/python3"):
        if not Path(python).exists():
            continue
        done = subprocess.run(
            [
                python,
                "-c",
                "import json, sys, yaml; "
                "print(json.dumps(list(yaml.safe_load_all(open(sys.argv[1])))))",
                str(path),
            ],
            capture_output=True,
            text=True,
        )
        if done.returncode == 0:
            return json.loads(done.stdout)
    return None


def yaml_scalar(text: str, key: str) -> str:
    """The one plain scalar ``key: value`` in ``text`` (quotes removed)."""
    (value,) = re.findall(rf"^\s*{re.escape(key)}:\s*(.+?)\s*$", text, re.MULTILINE)
    return value.strip("\"'")


def yaml_folded(text: str, key: str) -> str:
    """The folded block scalar ``key: >-`` in ``text``, its lines joined by spaces."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if re.match(rf"\s*{key}: >-$", line))
    indent = len(lines[start]) - len(lines[start].lstrip())
    body = []
    for line in lines[start + 1 :]:
        if line.strip() and len(line) - len(line.lstrip()) <= indent:
            break
        body.append(line.strip())
    return " ".join(part for part in body if part)


def container_command(text: str) -> list[str]:
    """The worker container's ``command`` list (block style) in the Deployment."""
    match = re.search(r"^(\s*)command:\n((?:\1  - .*\n)+)", text, re.MULTILINE)
    assert match is not None
    return [line.strip()[2:].strip("\"'") for line in match.group(2).splitlines()]


def probe_commands(text: str) -> dict[str, list[str]]:
    """Each probe's exec command (flow style), by probe name."""
    found = re.findall(r"^\s*(\w+Probe):\n\s*exec:\n\s*command: \[(.*)\]$", text, re.MULTILINE)
    return {name: [arg.strip().strip("\"'") for arg in args.split(",")] for name, args in found}


# -- systemd ---------------------------------------------------------------------------


def read_unit() -> configparser.ConfigParser:
    unit = configparser.ConfigParser(interpolation=None, strict=False)
    unit.optionxform = str  # type: ignore[assignment,method-assign]  # keys are case-sensitive
    unit.read_string(UNIT.read_text())
    return unit


def test_the_systemd_unit_stops_gracefully_within_its_timeout():
    service = read_unit()["Service"]
    argv = shlex.split(service["ExecStart"])
    assert argv[1:3] == ["manage.py", "runworkers"]
    options = runworkers_options(argv[3:])
    assert service["KillSignal"] == "SIGTERM"
    # SIGTERM to the supervisor only; SIGKILL to the group after the timeout.
    assert service["KillMode"] == "mixed"
    assert float(service["TimeoutStopSec"].rstrip("s")) > options["grace"] == 30
    assert service["Restart"] == "on-failure"
    assert service["Type"] in {"simple", "exec"}


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd is not installed")
def test_systemd_analyze_verify_accepts_the_unit(tmp_path):
    # verify insists the program exists: point it at this interpreter.
    text = UNIT.read_text().replace("/srv/app/.venv/bin/python", sys.executable)
    copy = tmp_path / UNIT.name
    copy.write_text(text)
    done = subprocess.run(
        ["systemd-analyze", "verify", str(copy)], capture_output=True, text=True, timeout=60
    )
    # It exits 0 even on settings it ignores: every warning counts.
    assert (done.returncode, done.stdout + done.stderr) == (0, "")


# -- Kubernetes ------------------------------------------------------------------------


def test_the_deployment_gives_the_workers_their_grace_and_real_probes():
    text = DEPLOYMENT.read_text()
    command = container_command(text)
    assert command[:3] == ["python", "manage.py", "runworkers"]
    options = runworkers_options(command[3:])
    grace = options["grace"]
    assert grace == 30
    assert int(yaml_scalar(text, "terminationGracePeriodSeconds")) > grace
    probes = probe_commands(text)
    assert set(probes) == {"startupProbe", "livenessProbe", "readinessProbe"}
    assert probes["readinessProbe"][2:] == ["rdbtasks", "probe", "ready"]
    live = probes["livenessProbe"]
    assert live[2:5] == ["rdbtasks", "probe", "live"]
    within = float(after(live, "--within")) if "--within" in live else DEFAULT_HEARTBEAT_WITHIN
    # Several heartbeats (every lease / 3) may be missed before it fails.
    assert within >= 3 * (options["lease"] or DEFAULT_LEASE) / 3
    # The kubelet's timeout leaves the probe its own database timeout and a start.
    for seconds in re.findall(r"timeoutSeconds: (\d+)", text):
        assert int(seconds) > DEFAULT_PROBE_TIMEOUT + 5


def test_the_deployment_parses_as_yaml_into_the_same_values():
    docs = load_yaml(DEPLOYMENT)
    if docs is None:
        pytest.skip("no YAML parser here (PyYAML is not a dependency)")
    (deployment,) = docs
    assert deployment["kind"] == "Deployment"
    spec = deployment["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    text = DEPLOYMENT.read_text()
    assert container["command"] == container_command(text)
    assert spec["terminationGracePeriodSeconds"] == int(
        yaml_scalar(text, "terminationGracePeriodSeconds")
    )
    probes = probe_commands(text)
    for name, argv in probes.items():
        assert container[name]["exec"]["command"] == argv
    assert deployment["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_the_deployments_probe_commands_pass_against_a_running_worker(run_workers):
    start_worker(run_workers)
    for name, argv in probe_commands(DEPLOYMENT.read_text()).items():
        assert argv[:2] == ["python", "manage.py"]
        code, out = probe(*argv[4:])  # after "rdbtasks probe": the same command
        assert code == 0, f"{name}: {out}"


# -- KEDA ------------------------------------------------------------------------------


def keda_query() -> str:
    return yaml_folded(SCALEDOBJECT.read_text(), "query")


def test_the_keda_scaledobject_targets_the_deployment_and_its_capacity():
    text = SCALEDOBJECT.read_text()
    deployment = DEPLOYMENT.read_text()
    (target,) = re.findall(r"scaleTargetRef:\n\s*name: (\S+)", text)
    (name,) = re.findall(r"^metadata:\n\s*name: (\S+)", deployment, re.MULTILINE)
    assert target == name
    command = container_command(deployment)
    capacity = int(after(command, "--processes")) * int(after(command, "--threads"))
    per_pod = int(yaml_scalar(text, "targetQueryValue"))
    assert per_pod == capacity
    # The due count is capped where more could not add a replica.
    (limit,) = re.findall(r"LIMIT (\d+)", keda_query())
    assert int(limit) == int(yaml_scalar(text, "maxReplicaCount")) * per_pod
    query = keda_query()
    assert Task._meta.db_table in query
    assert f"status = '{TaskStatus.READY.value}'" in query
    assert f"status = '{TaskStatus.RUNNING.value}'" in query
    docs = load_yaml(SCALEDOBJECT)
    if docs is not None:
        scaled, auth = docs
        (trigger,) = scaled["spec"]["triggers"]
        assert trigger["type"] == "postgresql"
        assert trigger["metadata"]["query"] == query
        assert trigger["authenticationRef"]["name"] == auth["metadata"]["name"]


def vendor_keda_query() -> str:
    """The query for this test's database: as written on PostgreSQL; on MySQL and
    MariaDB (KEDA's mysql scaler) with their UTC clock, as docs/deploy.md says."""
    if connection.vendor == "postgresql":
        return keda_query()
    if connection.vendor == "mysql":
        return keda_query().replace("now()", "UTC_TIMESTAMP(6)")
    pytest.skip("KEDA has no SQLite scaler")


@pytest.mark.django_db
def test_the_keda_query_counts_due_and_running_tasks():
    query = vendor_keda_query()
    moment = now()
    for _ in range(3):
        make_task(TaskStatus.READY, run_after=moment - dt.timedelta(seconds=5))
    make_task(TaskStatus.READY, run_after=moment + dt.timedelta(hours=1))  # not due yet
    make_task(TaskStatus.WAITING)
    for _ in range(2):
        make_task(TaskStatus.RUNNING)
    make_task(TaskStatus.SUCCESSFUL)
    make_task(TaskStatus.FAILED)
    with connection.cursor() as cursor:
        cursor.execute(query)
        ((count,),) = cursor.fetchall()
    assert count == 5


@pytest.mark.django_db
def test_the_keda_query_caps_the_due_count():
    query = vendor_keda_query()
    (limit,) = re.findall(r"LIMIT (\d+)", keda_query())
    moment = now() - dt.timedelta(seconds=5)
    for _ in range(int(limit) + 5):
        make_task(TaskStatus.READY, run_after=moment)
    make_task(TaskStatus.RUNNING)
    with connection.cursor() as cursor:
        cursor.execute(query)
        ((count,),) = cursor.fetchall()
    assert count == int(limit) + 1
