"""The alias modules import one way: resolve (the alias table) -> tiny -> aliases, with no import back, not
even inside a function."""

from __future__ import annotations

import ast
from pathlib import Path

import pettingllms.models

PACKAGE = Path(pettingllms.models.__file__).parent


def models_imports(module: str) -> set[str]:
    """Modules of pettingllms.models that ``module`` imports anywhere in its code."""
    found = set()
    for node in ast.walk(ast.parse((PACKAGE / f"{module}.py").read_text())):
        if isinstance(node, ast.ImportFrom) and node.module == "pettingllms.models":
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("pettingllms.models."):
            found.add(node.module.split(".")[2])
        elif isinstance(node, ast.Import):
            found.update(a.name.split(".")[2] for a in node.names if a.name.startswith("pettingllms.models."))
    return found


def test_imports_between_resolve_tiny_and_aliases_go_one_way():
    assert {"aliases", "tiny"} <= models_imports("resolve")
    assert "resolve" not in models_imports("tiny")
    assert not {"resolve", "tiny"} & models_imports("aliases")
