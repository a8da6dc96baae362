"""The package's import graph: no circle through ``db``, no private name imported.

Every import counts, at module level, inside a function or under
``TYPE_CHECKING``: a circle hidden behind one is still a circle. A package
``__init__`` that defines nothing and only hands on its submodules' names is
not a module of its own: an import of a name from it is an import of the
submodule the name comes from.
"""

from __future__ import annotations

import ast
from pathlib import Path

import django_rdbtasks

ROOT = Path(django_rdbtasks.__file__).parent


def modules() -> dict[str, Path]:
    found = {}
    for path in ROOT.rglob("*.py"):
        if "migrations" in path.parts:
            continue
        parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def defines(tree: ast.Module) -> bool:
    kinds = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
    return any(isinstance(node, kinds) for node in tree.body)


def absolute(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def graph() -> tuple[dict[str, set[str]], list[str]]:
    """Each module's imports of the package's modules, and the private names imported."""
    mods = modules()
    trees = {name: ast.parse(path.read_text(), str(path)) for name, path in mods.items()}
    faces: dict[str, dict[str, str]] = {}
    for name, tree in trees.items():
        if mods[name].name == "__init__.py" and not defines(tree):
            faces[name] = {
                alias.asname or alias.name: absolute(name, True, node)
                for node in ast.walk(tree)
                if isinstance(node, ast.ImportFrom) and node.level
                for alias in node.names
            }
    edges: dict[str, set[str]] = {name: set() for name in mods}
    private = []
    for name, tree in trees.items():
        is_package = mods[name].name == "__init__.py"
        for node in ast.walk(tree):
            targets: list[tuple[str, str | None]] = []
            if isinstance(node, ast.Import):
                targets = [(alias.name, None) for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                source = absolute(name, is_package, node)
                for alias in node.names:
                    if f"{source}.{alias.name}" in mods:
                        targets.append((f"{source}.{alias.name}", alias.name))
                    else:
                        target = faces.get(source, {}).get(alias.name, source)
                        targets.append((target, alias.name))
            for target, imported in targets:
                while target and target not in mods and "." in target:
                    target = target.rsplit(".", 1)[0]
                if target not in mods or target == name:
                    continue
                if name in faces and target.startswith(name + "."):
                    continue  # a face handing on its own submodules' names
                edges[name].add(target)
                if imported and imported.startswith("_") and not imported.startswith("__"):
                    private.append(f"{name} imports {imported} from {target}")
    return edges, private


def circles(edges: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components of more than one module (Tarjan's)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[set[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(component)

    for v in edges:
        if v not in index:
            visit(v)
    return found


def test_no_circle_goes_through_the_database_layer():
    edges, _ = graph()
    through_db = [
        sorted(c) for c in circles(edges) if any(m.startswith("django_rdbtasks.db") for m in c)
    ]
    assert through_db == []


def test_the_dialects_read_no_model():
    # The models use db (DbNow, the finished rows' SQL); of the models, db
    # needs only the tables' names, which the dialect registry reads and
    # hands down. The catalog renders statements for the docs, above both.
    above_the_models = {"django_rdbtasks.db.dialects", "django_rdbtasks.db.catalog"}
    edges, _ = graph()
    upward = {
        f"{module} -> {target}"
        for module, targets in edges.items()
        if module.startswith("django_rdbtasks.db") and module not in above_the_models
        for target in targets
        if target.startswith("django_rdbtasks.models")
    }
    assert upward == set()


def test_no_private_name_is_imported_from_another_module():
    _, private = graph()
    assert private == []


def test_the_graph_sees_imports_inside_functions_and_under_type_checking():
    edges, _ = graph()
    # dialects.model_tables imports the models inside the function.
    assert "django_rdbtasks.models.tasks" in edges["django_rdbtasks.db.dialects"]
