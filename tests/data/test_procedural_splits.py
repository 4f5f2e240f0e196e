"""An env's own splits must be disjoint: validation on tasks the run trains on measures memory, not skill."""

from __future__ import annotations

import pytest

from pettingllms.core import DataError, Problem
from pettingllms.data.problems import PROCEDURAL, check_disjoint
from lenient_nim import LenientNim


def _problems(prefix: str, ids) -> list[Problem]:
    return [Problem(f"{prefix}-{i}", {}) for i in ids]


def test_an_envs_test_split_that_shares_task_ids_with_train_is_refused_naming_them():
    training = _problems("task", range(100_000))
    with pytest.raises(DataError, match=r"shares task ids with 'train' \(task-1000, task-1001, task-1002, task-1003, "
                                        r"task-1004, \.\.\. 50 in all\)"):
        check_disjoint(LenientNim(), training, {PROCEDURAL: _problems("task", range(1000, 1050))})
    assert check_disjoint(LenientNim(), training, {PROCEDURAL: _problems("task", range(10**6, 10**6 + 50))}) == []


def test_a_file_set_that_shares_problems_with_training_is_said_not_refused():
    (warning,) = check_disjoint(LenientNim(), _problems("gsm", range(10)), {"gsm_test": _problems("gsm", [3, 11])})
    assert "'gsm_test' shares problem ids with the training data (gsm-3)" in warning
