"""Which modules a worker imports for a row, and which tasks enqueue and the checks refuse.

The distributions here are real ones as far as ``importlib.metadata`` can
tell: dist-info directories with METADATA and RECORD, written into a
directory put on ``sys.path`` (and on a worker process's PYTHONPATH), as pip
would leave them. Nothing is mocked: the rule reads them as it reads Wagtail's.
"""

from __future__ import annotations

import importlib
import sys
import textwrap
from collections.abc import Iterator
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.test import override_settings

from django_rdbtasks.checks import check_declared_tasks
from django_rdbtasks.compat import InvalidTask
from django_rdbtasks.distributions import installed_distributions, packages_required_by
from django_rdbtasks.exceptions import InvalidTaskPath
from django_rdbtasks.loading import (
    check_loadable,
    declared_task_paths,
    is_trusted_module,
    load_task,
)
from django_rdbtasks.models import Task
from django_rdbtasks.worker import Worker
from tests.conftest import ROOT

TASKS_MODULE = """
from django_rdbtasks.compat import HAS_DJANGO_TASKS

if HAS_DJANGO_TASKS:
    from django.tasks import task
else:
    from django_tasks import task


@task()
def ping(word):
    return f"{__name__}: {word}"


def helper(word):
    return word
"""

#: Distribution -> (packages it installs, its Requires-Dist lines). Module names
#: carry a prefix of their own, so nothing on the real sys.path answers for them.
DISTRIBUTIONS: dict[str, tuple[list[str], list[str]]] = {
    # An installed app's distribution, as wagtail is for wagtail.search.
    "rdbt-shop-app": (
        ["rdbt_shopapp"],
        [
            "rdbt-shop-lib>=1.0",
            'rdbt-python-only; python_version >= "3"',
            'rdbt-unasked-lib; extra == "more"',
            "rdbt-not-installed>=2",
        ],
    ),
    # What it requires, as wagtail requires modelsearch (no app of its own).
    "rdbt-shop-lib": (["rdbt_shoplib"], ["rdbt-deep-lib (>=0.1)", "rdbt-ns-ours"]),
    # Required by a requirement.
    "rdbt_Deep.Lib": (["rdbt_deeplib"], []),
    # A requirement with an environment marker, installed: followed.
    "rdbt-python-only": (["rdbt_pythononly"], []),
    # Required only for an extra: not followed.
    "rdbt-unasked-lib": (["rdbt_unaskedlib"], []),
    # Installed, required by nobody.
    "rdbt-stray-lib": (["rdbt_straylib"], []),
    # Two distributions sharing the namespace package rdbt_ns.
    "rdbt-ns-ours": (["rdbt_ns/ours"], []),
    "rdbt-ns-theirs": (["rdbt_ns/theirs"], []),
}


def write_distribution(site: Path, name: str, packages: list[str], requires: list[str]) -> None:
    """A distribution as pip installs one: its packages, and a dist-info naming their files."""
    files = []
    for package in packages:
        directory = site / package
        directory.mkdir(parents=True)
        for module, text in (("__init__.py", ""), ("tasks.py", TASKS_MODULE)):
            (directory / module).write_text(text)
            files.append(f"{package}/{module}")
    info = site / f"{name.replace('-', '_')}-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\n"
        f"Name: {name}\n"
        "Version: 1.0\n"
        + "".join(f"Requires-Dist: {requirement}\n" for requirement in requires)
        + "\nA long description: Requires-Dist: rdbt-stray-lib is no requirement here.\n"
    )
    files += [f"{info.name}/METADATA", f"{info.name}/RECORD", "../../bin/rdbt-script"]
    (info / "RECORD").write_text("".join(f"{path},,\n" for path in files))


@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A directory of installed distributions on sys.path, gone (modules too) afterwards."""
    site = tmp_path / "site-packages"
    site.mkdir()
    for name, (packages, requires) in DISTRIBUTIONS.items():
        write_distribution(site, name, packages, requires)
    monkeypatch.syspath_prepend(str(site))
    importlib.invalidate_caches()
    yield site
    for module in [name for name in sys.modules if name.startswith("rdbt_")]:
        del sys.modules[module]


@pytest.fixture
def shop_installed(site: Path) -> Iterator[Path]:
    """The shop app in INSTALLED_APPS (the loading rule forgets what it read when it changes)."""
    from django.conf import settings

    with override_settings(INSTALLED_APPS=[*settings.INSTALLED_APPS, "rdbt_shopapp"]):
        yield site


# -- the distributions an installed app brings -----------------------------------------------


def test_required_packages_follow_requirements_transitively(site):
    assert packages_required_by(["rdbt_shopapp.apps"]) >= {
        "rdbt_shopapp",  # the app's own distribution
        "rdbt_shoplib",  # required by it
        "rdbt_deeplib",  # required by what it requires, under a name spelt otherwise
        "rdbt_pythononly",  # required under an environment marker, and installed
        "rdbt_ns.ours",
    }


def test_required_packages_leave_out_extras_strays_and_others_in_a_namespace(site):
    required = packages_required_by(["rdbt_shopapp"])
    assert not required & {"rdbt_unaskedlib", "rdbt_straylib", "rdbt_ns.theirs", "rdbt_ns"}
    # Nothing here is a distribution: no module of a project brings anything.
    assert packages_required_by(["tests.testapp"]) == frozenset()


def test_a_distribution_reads_as_its_packages_and_followed_requirements(site):
    (shop,) = [d for d in installed_distributions() if d.name == "rdbt-shop-app"]
    assert shop.packages == {"rdbt_shopapp"}
    assert shop.requires == {"rdbt-shop-lib", "rdbt-python-only", "rdbt-not-installed"}
    (ours,) = [d for d in installed_distributions() if d.name == "rdbt-ns-ours"]
    assert ours.packages == {"rdbt_ns.ours"}


def test_an_editable_install_is_known_by_its_top_level_txt(site):
    """An editable install's RECORD names only the finder it puts on sys.path."""
    info = site / "rdbt_editable-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: rdbt-editable\nVersion: 1.0\nRequires-Dist: rdbt-stray-lib\n"
    )
    (info / "RECORD").write_text(
        "__editable__.rdbt_editable-1.0.pth,,\n__editable___rdbt_editable_1_0_finder.py,,\n"
    )
    (info / "top_level.txt").write_text("rdbt_editable\n")
    assert packages_required_by(["rdbt_editable.apps"]) == {"rdbt_editable", "rdbt_straylib"}


def test_a_distribution_whose_metadata_cannot_be_read_vouches_for_nothing(site):
    info = site / "rdbt_garbled-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_bytes(b"Name: rdbt-garbled\nRequires-Dist: \xff\xfe\n")
    (info / "RECORD").write_text("rdbt_garbled/__init__.py,,\n")
    assert "rdbt-garbled" not in {d.name for d in installed_distributions()}
    assert "rdbt_shoplib" in packages_required_by(["rdbt_shopapp"])  # the others still count


# -- which modules are trusted ---------------------------------------------------------------


def test_trusted_are_apps_what_their_distributions_require_and_the_setting(shop_installed):
    assert is_trusted_module("tests.testapp.tasks")  # an installed app
    assert is_trusted_module("rdbt_shopapp.tasks")  # ditto, from a distribution
    assert is_trusted_module("rdbt_shoplib.tasks")  # what its distribution requires
    assert is_trusted_module("rdbt_deeplib.tasks")  # transitively
    assert is_trusted_module("rdbt_ns.ours.tasks")
    assert is_trusted_module("tests.test_contract")  # RDBTASKS_TASK_MODULES
    for module in ("rdbt_straylib.tasks", "rdbt_unaskedlib.tasks", "rdbt_ns.theirs.tasks"):
        assert not is_trusted_module(module), module
    assert not is_trusted_module("rdbt_shoplibrary.tasks")  # a prefix is not a package
    assert not is_trusted_module("os")


def test_without_the_app_its_libraries_are_not_trusted(site):
    assert not is_trusted_module("rdbt_shoplib.tasks")


def test_the_setting_trusts_a_package_nothing_requires(shop_installed):
    with override_settings(RDBTASKS_TASK_MODULES=["rdbt_straylib"]):
        assert is_trusted_module("rdbt_straylib.tasks")
        assert load_task("rdbt_straylib.tasks.ping").call("a") == "rdbt_straylib.tasks: a"
    assert not is_trusted_module("rdbt_straylib.tasks")


def test_a_worker_imports_a_required_librarys_module_it_had_not_imported(shop_installed):
    assert "rdbt_deeplib.tasks" not in sys.modules
    task = load_task("rdbt_deeplib.tasks.ping")
    assert task.call("hello") == "rdbt_deeplib.tasks: hello"


def test_an_untrusted_module_is_never_imported(shop_installed):
    with pytest.raises(InvalidTaskPath, match="add its package to RDBTASKS_TASK_MODULES"):
        load_task("rdbt_straylib.tasks.ping")
    assert "rdbt_straylib" not in sys.modules


def test_a_trusted_librarys_function_that_is_no_task_is_not_run(shop_installed):
    with pytest.raises(InvalidTaskPath, match="is not a task: found function"):
        load_task("rdbt_shoplib.tasks.helper")


def test_a_trusted_module_that_fails_its_import_in_its_own_way_is_a_bad_path(shop_installed):
    (shop_installed / "rdbt_shoplib" / "broken.py").write_text(
        "raise RuntimeError('needs a GDAL this machine lacks')\n"
    )
    with pytest.raises(InvalidTaskPath) as refused:
        load_task("rdbt_shoplib.broken.task")
    assert str(refused.value) == (
        "'rdbt_shoplib.broken.task': cannot import 'rdbt_shoplib.broken': "
        "RuntimeError: needs a GDAL this machine lacks"
    )


# -- enqueue -----------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_required_librarys_task_is_enqueued_and_run(shop_installed):
    shoplib = importlib.import_module("rdbt_shoplib.tasks")
    result = shoplib.ping.enqueue("monday")
    Worker(burst=True).run(install_signals=False)
    result.refresh()
    assert result.return_value == "rdbt_shoplib.tasks: monday"


@pytest.mark.django_db(transaction=True)
def test_a_stray_librarys_task_is_refused_naming_the_setting(shop_installed):
    stray = importlib.import_module("rdbt_straylib.tasks")
    with pytest.raises(InvalidTask) as refused:
        stray.ping.enqueue("monday")
    assert str(refused.value) == (
        "'rdbt_straylib.tasks.ping': module 'rdbt_straylib.tasks' is not part of an "
        "installed app, nor of a distribution an installed app requires, so workers do not "
        "import it (add its package to RDBTASKS_TASK_MODULES to allow it)."
    )
    assert not Task.objects.exists()


# -- the system check (E012) -------------------------------------------------------------------


def test_every_task_made_for_this_backend_is_recorded_as_declared():
    from tests import not_an_app
    from tests.testapp import tasks

    assert {tasks.add.module_path, not_an_app.report.module_path} <= declared_task_paths()
    # .using() makes a task too, by the same path.
    assert tasks.add.using(priority=3).module_path in declared_task_paths()


def test_the_check_names_a_declared_task_no_worker_would_load_and_the_setting():
    from tests import not_an_app  # noqa: F401  (declares its task)

    errors = [e for e in check_declared_tasks() if "tests.not_an_app" in e.msg]
    assert [e.id for e in errors] == ["django_rdbtasks.E012"]
    assert errors[0].msg.startswith(
        "Task 'tests.not_an_app.report' cannot be enqueued: 'tests.not_an_app.report': "
        "module 'tests.not_an_app' is not part of an installed app"
    )
    assert errors[0].hint == (
        "Move it into an installed app, or add 'tests.not_an_app' (or a package above it) "
        "to RDBTASKS_TASK_MODULES."
    )


def test_a_module_every_worker_imports_at_start_is_trusted():
    """RDBTASKS_IMPORTS: what the workers import at start, they run tasks of."""
    from tests import not_an_app  # noqa: F401  (declares its task)

    assert any("tests.not_an_app" in e.msg for e in check_declared_tasks())
    with override_settings(RDBTASKS_IMPORTS=["tests.not_an_app"]):
        assert not [e for e in check_declared_tasks() if "tests.not_an_app" in e.msg]
        check_loadable("tests.not_an_app.report")
    with pytest.raises(InvalidTaskPath):
        check_loadable("tests.not_an_app.report")


def test_the_check_passes_tasks_of_apps_of_required_libraries_and_of_the_setting(shop_installed):
    importlib.import_module("rdbt_shoplib.tasks")
    importlib.import_module("rdbt_straylib.tasks")
    flagged = {e.msg.split("'")[1] for e in check_declared_tasks()}
    assert "rdbt_straylib.tasks.ping" in flagged
    assert not {"rdbt_shoplib.tasks.ping", "tests.testapp.tasks.add"} & flagged
    with override_settings(RDBTASKS_TASK_MODULES=["rdbt_straylib", "tests"]):
        assert check_declared_tasks() == []


def test_the_check_says_so_of_a_task_bound_to_another_name(shop_installed):
    (shop_installed / "rdbt_shoplib" / "aliases.py").write_text(
        TASKS_MODULE + "\n\ndef send_impl(word):\n    return word\n\n\nsend = task()(send_impl)\n"
    )
    importlib.import_module("rdbt_shoplib.aliases")
    (error,) = [e for e in check_declared_tasks() if "rdbt_shoplib.aliases" in e.msg]
    assert error.msg == (
        "Task 'rdbt_shoplib.aliases.send_impl' cannot be enqueued: "
        "'rdbt_shoplib.aliases.send_impl' is not a task: found function, "
        "expected an object made with the @task decorator."
    )
    assert error.hint == (
        "A worker finds a task by its function's name in its module: put @task() on the "
        "function itself."
    )


@pytest.mark.django_db
def test_manage_py_check_fails_on_such_a_task():
    from tests import not_an_app  # noqa: F401

    with override_settings(SILENCED_SYSTEM_CHECKS=[]), pytest.raises(SystemCheckError) as failed:
        call_command("check", stdout=StringIO(), stderr=StringIO())
    assert "(django_rdbtasks.E012) Task 'tests.not_an_app.report'" in str(failed.value)


# -- a real worker process, which has imported none of it ----------------------------------


WORKER_SETTINGS = """
from tests.settings import *  # noqa: F403

INSTALLED_APPS = [*INSTALLED_APPS, "rdbt_shopapp"]  # noqa: F405
"""


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_worker_process_runs_the_tasks_of_libraries_its_apps_require(site, run_workers):
    (site / "rdbt_worker_settings.py").write_text(textwrap.dedent(WORKER_SETTINGS))
    paths = {
        "rdbt_shoplib.tasks.ping": "SUCCESSFUL",
        "rdbt_deeplib.tasks.ping": "SUCCESSFUL",
        "rdbt_ns.ours.tasks.ping": "SUCCESSFUL",
        "rdbt_straylib.tasks.ping": "FAILED",
        "rdbt_ns.theirs.tasks.ping": "FAILED",
    }
    rows = {path: Task.objects.create(task_path=path, args=["hi"]) for path in paths}
    workers = run_workers(
        "--burst",
        env={
            "PYTHONPATH": f"{ROOT}:{site}",
            "DJANGO_SETTINGS_MODULE": "rdbt_worker_settings",
        },
    )
    assert workers.wait(timeout=120) == 0, workers.log()
    for path, row in rows.items():
        row.refresh_from_db()
        assert row.status == paths[path], (path, row.history, workers.log())
        if row.status == "SUCCESSFUL":
            assert row.return_value == f"{path.rpartition('.')[0]}: hi"
        else:
            assert "add its package to RDBTASKS_TASK_MODULES" in row.history[-1]["traceback"]
