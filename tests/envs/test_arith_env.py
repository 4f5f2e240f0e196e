"""arith_duo, the quickstart task: disjoint train/test seeds, the optional training pool, parsing and rewards."""

import pytest

from pettingllms.envs.arith.env import ArithDuoEnv, parse_number


def test_train_and_test_problems_are_disjoint():
    env = ArithDuoEnv()
    train = {p.problem_id for p in env.procedural_problems("train", 500)}
    test = {p.problem_id for p in env.procedural_problems("test", 500)}
    assert len(train) == len(test) == 500 and not train & test


def test_train_pool_limits_training_problems_but_not_validation():
    env = ArithDuoEnv(train_pool=16)
    pool = env.procedural_problems("train", 100_000)
    assert [p.problem_id for p in pool] == [p.problem_id for p in ArithDuoEnv().procedural_problems("train", 16)]
    assert len(env.procedural_problems("test", 50)) == 50
    with pytest.raises(ValueError, match="train_pool"):
        ArithDuoEnv(train_pool=-1)


def test_parse_and_rewards():
    assert parse_number("7 + 5 = 12. The answer is \\boxed{12}.") == 12
    assert parse_number("so 3 - 9 = -6") == -6 and parse_number("no digits") is None and parse_number(None) is None
    env = ArithDuoEnv()
    problem = env.procedural_problems("train", 1)[0]
    state = env.reset(problem, seed=0)
    right, wrong = problem.data["answer"], problem.data["answer"] + 1
    state = env.step(state, "solver", wrong).state
    done = env.step(state, "checker", right)
    assert not done.terminated  # the checker disagrees with the solver: another turn
    assert env.team_reward(done.state) == 1.0 and env.success(done.state)
    agreed = env.step(state, "checker", wrong)
    assert agreed.terminated and env.team_reward(agreed.state) == 0.0
