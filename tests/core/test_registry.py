from __future__ import annotations

import sys


import pytest

from pettingllms.core import RegistryError
from pettingllms.core.registry import ENVS, Registry


class A:
    pass


class B:
    pass


def test_register_and_get_by_name_and_lazily():
    reg = Registry("thing")
    reg.register("a", A)
    reg.register("lazy_b", f"{__name__}:B")
    assert reg.get("a") is A
    assert reg.get("lazy_b") is B
    assert reg.get(f"{__name__}:A") is A  # module:Class works without registration


def test_decorator_registration():
    reg = Registry("thing")

    @reg.register("dec")
    class C:
        pass

    assert reg.get("dec") is C


def test_unknown_name_lists_close_matches_and_valid_names():
    reg = Registry("env")
    reg.register("sokoban", A)
    reg.register("sudoku", B)
    with pytest.raises(RegistryError) as info:
        reg.get("sokobn")
    message = str(info.value)
    assert "'sokoban'" in message and "Did you mean" in message and "['sokoban', 'sudoku']" in message


def test_conflicting_reregistration_raises_but_same_object_is_a_noop():
    reg = Registry("env")
    reg.register("x", A)
    reg.register("x", A)
    reg.register("x", f"{__name__}:A")  # the same class, named lazily
    with pytest.raises(RegistryError, match="already registered"):
        reg.register("x", B)


def test_import_errors_surface(tmp_path, monkeypatch):
    (tmp_path / "broken_plugin.py").write_text("import this_module_does_not_exist\nclass E: pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    reg = Registry("env")
    reg.register("broken", "broken_plugin:E")
    with pytest.raises(ImportError, match="this_module_does_not_exist"):
        reg.get("broken")
    with pytest.raises(RegistryError, match="no attribute"):
        reg.get(f"{__name__}:Missing")


def test_a_file_name_where_a_module_goes_is_answered_with_the_module_name(tmp_path, monkeypatch):
    from pettingllms.core.registry import ModuleImportError, import_module

    (tmp_path / "arith_team.py").write_text("X = 1\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    with pytest.raises(ModuleImportError, match=r"'arith_team.py' is a file name; name its module instead: "
                                                r"'arith_team'"):
        import_module("arith_team.py", "env.options.program='arith_team.py'")
    assert import_module("arith_team", "env.options.program='arith_team'").X == 1


def test_builtin_envs_come_from_the_entry_point():
    assert "toy_targets" in ENVS.names()


def test_names_with_colon_are_rejected():
    with pytest.raises(RegistryError):
        Registry("env").register("a:b", A)
