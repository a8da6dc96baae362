"""docs/architecture.md's module map names every module of the package, and only those."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "django_rdbtasks"
#: Not listed one by one: the migrations.
NOT_LISTED = ("migrations/",)


def map_entries() -> list[str]:
    """The paths at the start of the map's lines (``worker/lanes.py``, ``admin/``)."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    block = text.split("## Module map", 1)[1].split("```", 2)[1]
    return re.findall(r"^  ([\w/]+(?:\.py|/))(?:\s|$)", block, flags=re.MULTILINE)


def package_modules() -> set[str]:
    modules = {p.relative_to(PACKAGE).as_posix() for p in PACKAGE.rglob("*.py")}
    return {
        m
        for m in modules
        if not m.startswith(NOT_LISTED) and not (m.endswith("/__init__.py") or m == "__init__.py")
    }


def test_every_module_of_the_package_is_in_the_map() -> None:
    missing = package_modules() - set(map_entries())
    assert not missing, f"docs/architecture.md's module map lacks {sorted(missing)}"


def test_every_package_is_in_the_map() -> None:
    packages = {f"{p.name}/" for p in PACKAGE.iterdir() if (p / "__init__.py").exists()}
    missing = packages - set(map_entries()) - {"migrations/"}
    assert not missing, f"docs/architecture.md's module map lacks {sorted(missing)}"


def test_the_map_names_nothing_that_is_gone() -> None:
    entries = map_entries()
    assert len(entries) > 100  # the block was found and read
    gone = [e for e in entries if not (PACKAGE / e).exists()]
    assert not gone, f"docs/architecture.md's module map names what is gone: {gone}"


def test_the_map_lists_each_module_once() -> None:
    entries = map_entries()
    assert len(entries) == len(set(entries)), sorted(e for e in entries if entries.count(e) > 1)
