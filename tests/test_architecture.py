"""The layer table in docs/architecture.md, enforced: every import edge between the project's packages must be one
the table allows, lazy imports inside functions included, and ``core`` imports the standard library only."""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "pettingllms"
DOC = ROOT / "docs" / "architecture.md"


def layer_table(doc: str) -> dict[str, set[str]]:
    """package -> the project packages it may import, from the doc's "Layers" table."""
    section = doc.split("## Layers", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| ") and "`pettingllms/" in line]
    table = {}
    for row in rows:
        cells = [cell.strip() for cell in row.strip("|").split("|")]
        package = re.fullmatch(r"`pettingllms/(\w+?)(?:\.py)?`", cells[1]).group(1)
        allowed = cells[3]
        table[package] = set() if allowed == "none" else {name.strip() for name in allowed.split(",")}
    return table


def _package_of(path: Path, root: Path) -> str:
    parts = path.relative_to(root).parts
    return parts[0] if len(parts) > 1 else Path(parts[0]).stem


def imported_modules(source: str) -> list[str]:
    """Absolute module names a file imports, at any depth (function-level imports count too)."""
    names = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.append(node.module)
    return names


def import_edges(root: Path, top: str = "pettingllms") -> dict[tuple[str, str], list[str]]:
    """(from package, to package) -> the files that make that edge, for the package tree at ``root``."""
    edges: dict[tuple[str, str], list[str]] = {}
    for path in sorted(root.rglob("*.py")):
        if path == root / "__init__.py":
            continue
        source_package = _package_of(path, root)
        for module in imported_modules(path.read_text()):
            parts = module.split(".")
            if parts[0] != top or len(parts) < 2 or parts[1] == source_package:
                continue
            edges.setdefault((source_package, parts[1]), []).append(str(path.relative_to(root.parent)))
    return edges


def violations(edges: dict[tuple[str, str], list[str]], table: dict[str, set[str]]) -> list[str]:
    found = []
    for (source, target), files in sorted(edges.items()):
        if source not in table:
            found.append(f"{source} is not in the layer table (docs/architecture.md); imported by {files[0]}")
        elif target not in table[source]:
            found.append(f"{source} -> {target} is not allowed by the layer table: {', '.join(sorted(set(files)))}")
    return found


def test_every_package_is_in_the_table_and_the_table_names_only_packages():
    table = layer_table(DOC.read_text())
    packages = {p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists()} | {"cli"}
    packages -= {"configs"}  # YAML files, no code
    assert set(table) == packages
    for package, allowed in table.items():
        assert allowed <= set(table), (package, allowed - set(table))
        assert package not in allowed


def test_the_tables_edges_point_downward():
    """Each package may import only packages listed in rows above its own: the table is a layering, no cycles."""
    table = layer_table(DOC.read_text())
    order = list(table)
    for package, allowed in table.items():
        above = set(order[: order.index(package)])
        assert allowed <= above, (package, allowed - above)


def test_every_import_edge_is_allowed_by_the_table():
    assert violations(import_edges(PACKAGE), layer_table(DOC.read_text())) == []


def test_core_imports_only_the_standard_library():
    outside = {}
    for path in sorted((PACKAGE / "core").rglob("*.py")):
        for module in imported_modules(path.read_text()):
            top = module.split(".")[0]
            if top != "pettingllms" and top not in sys.stdlib_module_names:
                outside.setdefault(str(path.relative_to(ROOT)), []).append(module)
    assert outside == {}


def test_only_the_verl_adapter_imports_verl():
    importers = sorted(str(p.relative_to(ROOT)) for p in PACKAGE.rglob("*.py")
                       if any(m.split(".")[0] == "verl" for m in imported_modules(p.read_text())))
    assert importers == ["pettingllms/algo/verl_adapter.py"]


@pytest.mark.parametrize("placement", ["top", "lazy"])
def test_an_upward_import_is_caught(tmp_path, placement):
    """The check can fail: a core module that imports the trainer, at the top or inside a function."""
    tree = tmp_path / "pettingllms"
    for package in ("core", "trainer"):
        (tree / package).mkdir(parents=True)
        (tree / package / "__init__.py").write_text("")
    upward = "from pettingllms.trainer import loop\n"
    source = upward if placement == "top" else f"def f():\n    {upward}"
    (tree / "core" / "types.py").write_text(source)
    (tree / "trainer" / "loop.py").write_text("from pettingllms.core import types\n")
    table = {"core": set(), "trainer": {"core"}}
    assert violations(import_edges(tree), table) == [
        "core -> trainer is not allowed by the layer table: pettingllms/core/types.py"
    ]


# ---------------------------------------------------------------------------------------------- import circles

def module_graph(root: Path, top: str = "pettingllms") -> dict[str, set[str]]:
    """Module -> the project modules it imports (at any depth: lazy imports count), for the tree at ``root``.
    ``from a.b import c`` names module ``a.b.c`` when that is a file, else ``a.b``."""
    def name_of(path: Path) -> str:
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)

    files = {name_of(path): path for path in root.rglob("*.py")}
    graph = {}
    for module, path in files.items():
        targets = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets |= {alias.name for alias in node.names if alias.name in files}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith(top):
                for alias in node.names:
                    sub = f"{node.module}.{alias.name}"
                    targets.add(sub if sub in files else node.module)
        graph[module] = {t for t in targets if t in files and t != module}
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import circles: strongly connected groups of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for target in sorted(graph[node]):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_two_files_import_each_other_even_through_others():
    assert circles(module_graph(PACKAGE)) == []


def test_an_import_circle_is_caught(tmp_path):
    """The check can fail: two modules of one package that import each other, one of them lazily."""
    tree = tmp_path / "pettingllms" / "entry"
    tree.mkdir(parents=True)
    (tree.parent / "__init__.py").write_text("")
    (tree / "__init__.py").write_text("")
    (tree / "train.py").write_text("def f():\n    from pettingllms.entry.rehearse import go\n")
    (tree / "rehearse.py").write_text("from pettingllms.entry import train\n")
    assert circles(module_graph(tmp_path / "pettingllms")) == [["pettingllms.entry.rehearse",
                                                                 "pettingllms.entry.train"]]
