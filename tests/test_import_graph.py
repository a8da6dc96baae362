"""The package's import graph: no circle, and no private name imported from another module.

Every import counts, wherever it is written: at the top of a module, inside a
function, or under ``TYPE_CHECKING``; an import moved into a function still
makes the modules depend on each other. The graph is read with ``ast`` the way
``../shared/tools/import_cycles.py`` reads it, so that the two agree.
"""

from __future__ import annotations

import ast
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import django_rdbtasks

PACKAGE = Path(django_rdbtasks.__file__).resolve().parent


@dataclass
class ImportGraph:
    """Module name to the modules of the package it imports; and the private names imported."""

    edges: dict[str, set[str]] = field(default_factory=dict)
    private: list[str] = field(default_factory=list)

    def circles(self) -> list[set[str]]:
        """The strongly connected components of more than one module (Tarjan's algorithm)."""
        index: dict[str, int] = {}
        low: dict[str, int] = {}
        stack: list[str] = []
        on_stack: set[str] = set()
        found: list[set[str]] = []

        def visit(module: str) -> None:
            index[module] = low[module] = len(index)
            stack.append(module)
            on_stack.add(module)
            for imported in sorted(self.edges[module]):
                if imported not in index:
                    visit(imported)
                    low[module] = min(low[module], low[imported])
                elif imported in on_stack:
                    low[module] = min(low[module], index[imported])
            if low[module] == index[module]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == module:
                        break
                if len(component) > 1:
                    found.append(component)

        for module in sorted(self.edges):
            if module not in index:
                visit(module)
        return found


def defines_something(tree: ast.Module) -> bool:
    return any(
        isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
        for node in tree.body
    )


def absolute(module: str, is_package: bool, level: int, name: str | None) -> str:
    """The module a relative import (``from ..x import y``) names, seen from ``module``."""
    base = module.split(".")
    if not is_package:
        base = base[:-1]
    if level > 1:
        base = base[: len(base) - (level - 1)]
    return ".".join(base + ([name] if name else []))


def read_graph(package: Path) -> ImportGraph:
    """The import graph of the package in ``package`` (a directory), migrations left out."""
    files: dict[str, Path] = {}
    for path in package.rglob("*.py"):
        if "migrations" in path.parts:
            continue
        parts = list(path.relative_to(package.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        files[".".join(parts)] = path
    trees = {module: ast.parse(path.read_text(), str(path)) for module, path in files.items()}

    # A package's face (an __init__ that defines nothing and only hands on its
    # submodules' names): importing a name from it depends on the submodule
    # that defines the name, not on the whole package.
    faces: dict[str, dict[str, str]] = {}
    for module, path in files.items():
        if path.name != "__init__.py" or defines_something(trees[module]):
            continue
        faces[module] = {
            alias.asname or alias.name: absolute(module, True, node.level, node.module)
            for node in ast.walk(trees[module])
            if isinstance(node, ast.ImportFrom) and node.level
            for alias in node.names
        }

    graph = ImportGraph(edges={module: set() for module in files})
    for module, path in files.items():
        is_package = path.name == "__init__.py"
        is_face = module in faces
        for imported, name in imports_of(trees[module], module, is_package, files, faces):
            while imported and imported not in files and "." in imported:
                imported = imported.rsplit(".", 1)[0]
            if imported not in files or imported == module:
                continue
            if is_face and imported.startswith(module + "."):
                continue  # a face handing on its own submodules' names
            graph.edges[module].add(imported)
            if name and name.startswith("_") and not name.startswith("__"):
                graph.private.append(f"{module} imports {name} from {imported}")
    return graph


def imports_of(
    tree: ast.Module,
    module: str,
    is_package: bool,
    files: dict[str, Path],
    faces: dict[str, dict[str, str]],
) -> Iterator[tuple[str, str | None]]:
    """``(module imported, name imported or None)`` for every import in ``tree``, at any depth."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, None
        elif isinstance(node, ast.ImportFrom):
            source = (
                absolute(module, is_package, node.level, node.module)
                if node.level
                else node.module or ""
            )
            for alias in node.names:
                submodule = f"{source}.{alias.name}"
                if submodule in files:
                    yield submodule, alias.name
                elif alias.name in faces.get(source, {}):
                    yield faces[source][alias.name], alias.name
                else:
                    yield source, alias.name


def test_no_circle():
    circles = [sorted(circle) for circle in read_graph(PACKAGE).circles()]
    assert not circles, (
        "Import circles (counting imports inside functions and under TYPE_CHECKING): "
        f"{circles}. Move what the modules share below both."
    )


def test_the_dialects_read_no_model():
    # The models use db (DbNow, the finished rows' SQL); of the models, db
    # needs only the tables' names, which the dialect registry reads and
    # hands down. The catalog renders statements for the docs, above both.
    above_the_models = {"django_rdbtasks.db.dialects", "django_rdbtasks.db.catalog"}
    upward = {
        f"{module} -> {target}"
        for module, targets in read_graph(PACKAGE).edges.items()
        if module.startswith("django_rdbtasks.db") and module not in above_the_models
        for target in targets
        if target.startswith("django_rdbtasks.models")
    }
    assert upward == set()


def test_no_private_name_is_imported_from_another_module():
    private = read_graph(PACKAGE).private
    assert not private, f"{private}: what two modules share is public, and lives below both."


# -- the reading itself, on packages made for it -------------------------------------------


def write_package(root: Path, modules: dict[str, str]) -> Path:
    package = root / "pkg"
    for name, source in {"__init__": "", **modules}.items():
        path = package.joinpath(*name.split(".")).with_suffix(".py")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(source))
    return package


def test_imports_inside_functions_and_under_type_checking_make_circles(tmp_path):
    package = write_package(
        tmp_path,
        {
            "a": "from . import b\n",
            "b": "def f():\n    from .c import g\n",
            "c": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .a import X\n",
            "d": "import pkg.a\n",
        },
    )
    assert read_graph(package).circles() == [{"pkg.a", "pkg.b", "pkg.c"}]


def test_a_name_from_a_face_is_a_dependency_on_the_module_defining_it(tmp_path):
    package = write_package(
        tmp_path,
        {
            "models.__init__": "from .tasks import Task\nfrom .jobs import Job\n",
            "models.tasks": "class Task: ...\n",
            "models.jobs": "from ..validation import check\nclass Job: ...\n",
            "validation": "from .models import Task\ndef check(): ...\n",
        },
    )
    graph = read_graph(package)
    assert graph.edges["pkg.validation"] == {"pkg.models.tasks"}
    assert graph.circles() == []


def test_a_private_name_imported_from_another_module_is_found(tmp_path):
    package = write_package(
        tmp_path,
        {"a": "def _helper(): ...\n", "b": "def f():\n    from .a import _helper\n"},
    )
    assert read_graph(package).private == ["pkg.b imports _helper from pkg.a"]
