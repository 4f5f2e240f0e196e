"""docs/sandbox.md's module map is the import graph: every module of the package is in the table, and a module
imports only modules below it (so layer choice never imports the runner that uses it, and so on)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pettingllms.sandbox

PACKAGE = Path(pettingllms.sandbox.__file__).parent
DOC = Path(__file__).resolve().parents[2] / "docs" / "sandbox.md"


def table_rows() -> list[list[str]]:
    """Module names per row of the map, top to bottom."""
    text = DOC.read_text()
    table = text[text.index("### Module map"):].split("\n## ", 1)[0]
    return [re.findall(r"`(\w+)\.py`", line.split("|")[1]) for line in table.splitlines()
            if line.startswith("| `")]


def package_imports(module: str) -> set[str]:
    """Sibling modules that ``module`` imports, at any depth of its code (function-level imports count)."""
    tree = ast.parse((PACKAGE / f"{module}.py").read_text())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level == 1:
                found.update([node.module] if node.module else [alias.name for alias in node.names])
            elif node.module and node.module.startswith("pettingllms.sandbox."):
                found.add(node.module.split(".")[2])
        elif isinstance(node, ast.Import):
            found.update(a.name.split(".")[2] for a in node.names if a.name.startswith("pettingllms.sandbox."))
    return found


def test_the_module_map_lists_every_module_once():
    listed = [module for row in table_rows() for module in row]
    on_disk = sorted(p.stem for p in PACKAGE.glob("*.py") if p.stem != "__init__")
    assert sorted(listed) == on_disk


def test_modules_import_only_modules_below_them_in_the_map():
    rank = {module: i for i, row in enumerate(table_rows()) for module in row}
    upward = [f"{module} -> {imported}" for module in rank for imported in package_imports(module)
              if rank[imported] <= rank[module] and imported != module]
    assert upward == [], "imports that point up (or sideways) in docs/sandbox.md's module map"
