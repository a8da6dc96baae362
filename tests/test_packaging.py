"""What pip may install this package with: the Django lines it supports, and not 6.0."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"


def django_requirement() -> Requirement:
    project = tomllib.loads(PYPROJECT.read_text())["project"]
    found = [Requirement(d) for d in project["dependencies"] if Requirement(d).name == "Django"]
    assert len(found) == 1, found
    return found[0]


@pytest.mark.parametrize("version", ["5.2", "5.2.19", "6.1", "6.1.3", "6.2"])
def test_the_supported_django_lines_are_allowed(version):
    assert django_requirement().specifier.contains(version, prereleases=True)


@pytest.mark.parametrize("version", ["5.1.9", "6.0", "6.0.3", "6.0rc1"])
def test_django_6_0_and_older_lines_are_refused(version):
    # Django 6.0's django.tasks refuses the options this backend adds
    # (@task(max_attempts=5) fails at import): pip must not pick it.
    assert not django_requirement().specifier.contains(version, prereleases=True)
