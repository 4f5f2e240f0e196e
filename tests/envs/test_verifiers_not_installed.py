"""Without the verifiers package (the default venv), env.name=verifiers says how to install it, and check-env --all
names it as skipped (tests/core/test_checker.py; the verifiers lane, make test-verifiers, checks and trains it)."""

from __future__ import annotations

import importlib.util

import pytest

from pettingllms.cli import main
from pettingllms.core import EnvError

pytestmark = pytest.mark.skipif(importlib.util.find_spec("verifiers") is not None, reason="verifiers is installed")


def test_the_env_says_how_to_install_verifiers():
    from pettingllms.envs.verifiers_env import VerifiersEnv

    with pytest.raises(EnvError, match=r"verifiers is not installed: pip install -e '\.\[verifiers\]' \(verifiers==0\.4\.0.*install_verifiers"):
        VerifiersEnv()


def test_naming_it_to_check_env_fails(capsys):  # --all skips it: tests/core/test_checker.py::test_cli_exit_codes
    assert main(["check-env", "verifiers"]) == 1
    assert "verifiers is not installed" in capsys.readouterr().out


def test_a_training_run_is_refused_before_it_starts(tmp_path, capsys):
    assert main(["train", "env.name=verifiers", "rollout.mode=trajectory", "base_models.policy_0.path=tiny-random-smollm2",
                 "resources.use_ray=false", f"training.log_dir={tmp_path}"]) == 2
    assert "verifiers is not installed" in capsys.readouterr().err
