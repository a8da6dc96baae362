"""The packages installed apps bring with them, read from installed distributions' metadata.

An installed app comes from a distribution (``wagtail.search`` from
``wagtail``), and that distribution names what it needs in its metadata
(``Requires-Dist: modelsearch<1.4,>=1.3.2``). ``packages_required_by()``
follows those requirements, transitively, from the distributions that provide
the given modules, and returns the import names of every distribution it
reaches: the code an installed app can import, and so enqueue tasks of, without
the project naming it anywhere.

Only what ``importlib.metadata`` finds on ``sys.path`` counts: a package that
is no distribution (a project's own packages, a directory on ``PYTHONPATH``)
brings nothing. A requirement marked for an extra is not followed (the app did
not necessarily ask for that extra); one with another environment marker is
followed when it is installed, as then it was installed for someone.
"""

from __future__ import annotations

import csv
import re
from collections.abc import Iterable
from dataclasses import dataclass
from email.message import Message
from email.parser import HeaderParser
from importlib import metadata

#: The distribution's name at the start of a requirement ("Willow[heif]<2,>=1.11.0").
_REQUIREMENT_NAME = re.compile(r"\s*([A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?)")
#: An environment marker that makes a requirement an extra's: ``extra == "redis"``.
_EXTRA_MARKER = re.compile(r"\bextra\s*(?:==|!=|===|\bin\b|\bnot\s+in\b)")
#: Modules an editable install adds to find its code: not the distribution's code.
_EDITABLE_HELPER = "__editable__"


@dataclass(frozen=True)
class Installed:
    """One installed distribution, as far as trust in its code goes."""

    #: Normalized (PEP 503): ``django-modelcluster``.
    name: str
    #: The top-most dotted names of the code it installs: ``wagtail``, or
    #: ``google.cloud.storage`` inside the shared ``google`` namespace.
    packages: frozenset[str]
    #: Normalized names of the distributions it requires (not for an extra).
    requires: frozenset[str]


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def within(module_name: str, packages: Iterable[str]) -> bool:
    """Whether ``module_name`` is one of ``packages`` or inside one."""
    return any(
        module_name == package or module_name.startswith(package + ".") for package in packages
    )


def packages_required_by(module_names: Iterable[str]) -> frozenset[str]:
    """The packages of the distributions providing ``module_names`` and of all they require.

    Transitive: the requirements of a requirement are followed too. A required
    distribution that is not installed is skipped (a marker excluded it, or it
    is optional in practice); nothing here imports anything.
    """
    installed: dict[str, Installed] = {}
    for distribution in installed_distributions():
        # The first on sys.path wins, as it does for an import.
        installed.setdefault(distribution.name, distribution)
    names = list(module_names)
    pending = [
        distribution.name
        for distribution in installed.values()
        if any(within(module_name, distribution.packages) for module_name in names)
    ]
    reached: set[str] = set()
    while pending:
        name = pending.pop()
        if name in reached or name not in installed:
            continue
        reached.add(name)
        pending.extend(installed[name].requires)
    return frozenset(package for name in reached for package in installed[name].packages)


def installed_distributions() -> list[Installed]:
    """Every distribution on ``sys.path`` with its packages and requirements.

    One whose metadata cannot be read (not UTF-8, unreadable, no name) is left
    out: it then vouches for nothing, the safe side of a trust rule.
    """
    found = []
    for distribution in metadata.distributions():
        try:
            installed = _read(distribution)
        except (OSError, UnicodeDecodeError):
            continue
        if installed is not None:
            found.append(installed)
    return found


def _read(distribution: metadata.Distribution) -> Installed | None:
    headers = _headers(distribution)
    name = headers.get("Name")
    if not name:
        return None
    requires = headers.get_all("Requires-Dist") or []
    if not requires and distribution.read_text("requires.txt") is not None:
        requires = distribution.requires or []  # an egg-info's are in requires.txt
    return Installed(
        name=normalize(name),
        packages=frozenset(_packages_of(distribution)),
        requires=frozenset(_followed_requirements(requires)),
    )


def _headers(distribution: metadata.Distribution) -> Message:
    """The metadata's headers only: ``Distribution.metadata`` parses the whole
    long description too, which took 80 % of the time spent here."""
    text = distribution.read_text("METADATA") or distribution.read_text("PKG-INFO") or ""
    return HeaderParser().parsestr(text.split("\n\n", 1)[0])


def _packages_of(distribution: metadata.Distribution) -> set[str]:
    """The top-most packages (and modules) a distribution's files make importable.

    From its RECORD, read as text (``Distribution.files`` makes an object per
    file: Wagtail has 5,600). A directory without an ``__init__.py`` of the
    distribution's own is a namespace shared with others, so its packages start
    below it. ``top_level.txt`` stands in where the RECORD names no code of its
    own, as an editable install's does.
    """
    record = distribution.read_text("RECORD") or ""
    sources = [path for path in map(_record_path, record.splitlines()) if path.endswith(".py")]
    package_dirs = {
        path[: -len("/__init__.py")] for path in sources if path.endswith("/__init__.py")
    }
    packages = {
        directory.replace("/", ".")
        for directory in package_dirs
        if directory.rpartition("/")[0] not in package_dirs
    }
    for path in sources:
        directory = path.rpartition("/")[0]
        if directory in package_dirs or any(
            ancestor in package_dirs for ancestor in _ancestors(directory)
        ):
            continue  # inside a package found above
        if not path.rpartition("/")[2].startswith(_EDITABLE_HELPER):
            packages.add(path[: -len(".py")].replace("/", "."))
    if not packages:
        top_level = distribution.read_text("top_level.txt") or ""
        packages = {line.strip() for line in top_level.splitlines() if line.strip()}
    importable = {
        package for package in packages if all(p.isidentifier() for p in package.split("."))
    }
    # A package under a directory of the distribution that has no __init__.py
    # (wagtail/project_template/home) is inside its top-most package anyway.
    return {package for package in importable if not within(package, importable - {package})}


def _record_path(line: str) -> str:
    """A RECORD line's path: CSV, quoted only where the path has a comma or a quote."""
    if line.startswith('"'):
        return next(csv.reader([line]), [""])[0]
    return line.partition(",")[0]


def _ancestors(directory: str) -> list[str]:
    parts = directory.split("/")
    return ["/".join(parts[:depth]) for depth in range(1, len(parts))]


def _followed_requirements(requirements: Iterable[str]) -> set[str]:
    followed = set()
    for requirement in requirements:
        specifier, _, marker = requirement.partition(";")
        if _EXTRA_MARKER.search(marker):
            continue
        match = _REQUIREMENT_NAME.match(specifier)
        if match:
            followed.add(normalize(match.group(1)))
    return followed
