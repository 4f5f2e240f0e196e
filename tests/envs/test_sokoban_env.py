"""Sokoban: solvable generated levels, push rules and rewards, the tool/plan protocol, seeds."""

from __future__ import annotations

import json

import pytest

from pettingllms.envs.games_common.base import PLAN, TOOL
from pettingllms.envs.games_common.runner import EchoRunner
from pettingllms.envs.sokoban.env import (
    SokobanEnv,
    board_from_rows,
    generate_level,
    is_solved,
    move,
    solve_bfs,
)
from pettingllms.core import DataError, Problem
from pettingllms.core.checker import check_env

CORRIDOR = ["#######", "#@_$_.#", "#######"]  # push the box right twice to win


def fenced(code: str) -> str:
    return f"Here is my solver.\n```python\n{code}\n```\n"


def env(**kw):
    return SokobanEnv(runner=EchoRunner(), **kw)


def test_check_env_passes():
    report = check_env(env())
    assert report.ok, report.format()


@pytest.mark.parametrize("size,boxes,seeds", [(6, 1, range(40)), (7, 2, range(8))])
def test_generated_levels_are_solvable_and_unsolved(size, boxes, seeds):
    for seed in seeds:
        board = board_from_rows(generate_level(seed, size, boxes))
        assert not is_solved(board), f"seed {seed} starts solved"
        assert len(board.boxes) == boxes and (board.height, board.width) == (size, size)
        level = "\n".join(generate_level(seed, size, boxes))
        assert solve_bfs(board) is not None, f"seed {seed} is not solvable:\n{level}"


def test_generation_is_deterministic_and_varies_with_seed():
    assert generate_level(3) == generate_level(3)
    assert len({tuple(generate_level(s)) for s in range(20)}) > 10


def test_train_and_test_seed_spaces_are_disjoint():
    e = env()
    train = e.procedural_problems("train", 300)
    test = e.procedural_problems("test", 50)
    assert not {p.data["seed"] for p in train} & {p.data["seed"] for p in test}
    assert not {p.problem_id for p in train} & {p.problem_id for p in test}
    train_levels = {tuple(e.puzzle_data(p)["rows"]) for p in train[:100]}
    test_levels = {tuple(e.puzzle_data(p)["rows"]) for p in test}
    assert len(test_levels) > 30 and len(train_levels & test_levels) < 5


def test_problem_data_is_plain_and_seed_and_rows_give_the_same_state():
    e = env()
    seed_only = e.procedural_problems("train", 1)[0]
    full = e.materialize(seed_only)
    json.dumps(dict(full.data))  # plain values only
    assert isinstance(full.data["rows"], list) and all(isinstance(r, str) for r in full.data["rows"])
    assert e.reset(seed_only, 0) == e.reset(Problem("row", {"rows": full.data["rows"]}), 0)


def test_push_rules_and_shaped_rewards():
    board = board_from_rows(CORRIDOR)
    board, r = move(board, "R")  # walk: step cost only
    assert board.player == (1, 2) and r == pytest.approx(-0.01)
    board, r = move(board, "R")  # push the box one closer to the goal: shaping +0.1
    assert board.boxes == {(1, 4)} and r == pytest.approx(-0.01 + 0.1)
    blocked, r = move(board_from_rows(["######", "#@$#.#", "######"]), "R")  # box against a wall
    assert blocked.player == (1, 1) and r == pytest.approx(-0.06)
    wall, r = move(board_from_rows(CORRIDOR), "U")
    assert wall.player == (1, 1) and wall.moves == 1 and r == pytest.approx(-0.06)


def test_plan_step_solves_and_terminates_with_win_bonus():
    e = env()
    s0 = e.reset(Problem("c", {"rows": CORRIDOR}), 0)
    t = e.step(s0, PLAN, "R, R, R")
    assert t.terminated and not t.truncated and e.success(t.state)
    # -0.01 walk, two pushes (-0.01 + 0.1 each, the last lands on the goal +1), win +10
    assert e.team_reward(t.state) == pytest.approx(-0.01 + 2 * 0.09 + 1.0 + 10.0)
    assert t.state.plan_reward == e.team_reward(t.state)
    assert e.success(s0) is False and s0.board.player == (1, 1)  # the input state is untouched


def test_actions_after_the_win_are_ignored():
    e = env()
    s0 = e.reset(Problem("c", {"rows": CORRIDOR}), 0)
    a = e.step(s0, PLAN, "[R, R, R]").state
    b = e.step(s0, PLAN, "[R, R, R, L, L, L]").state
    assert a.board == b.board and a.real_return == b.real_return


def test_tool_step_simulates_on_a_copy_and_rewards_the_simulation():
    e = env()
    s0 = e.reset(Problem("c", {"rows": CORRIDOR}), 0)
    t = e.step(s0, TOOL, 'print("**Actions List**: [\'R\', \'R\', \'R\']")')
    tool = t.state.tool
    assert not t.terminated and t.state.board == s0.board and not e.success(t.state)
    assert tool.actions == ("R", "R", "R") and tool.sim_solved
    assert tool.sim_reward == pytest.approx(e.step(s0, PLAN, "R R R").state.plan_reward)
    agents = {a: cls for a, cls in zip((TOOL, PLAN), _agents(e))}
    assert agents[TOOL].local_reward(t.state) == pytest.approx(tool.sim_reward)
    assert e.team_reward(t.state) == 0.0  # the real board did not move


def test_missing_code_output_or_answer_costs_the_no_action_penalty():
    e = env()
    s0 = e.reset(e.example_problems(1)[0], 0)
    no_code = e.step(s0, TOOL, None).state
    no_marker = e.step(s0, TOOL, "print('hello')").state
    no_answer = e.step(s0, PLAN, None)
    assert no_code.tool.sim_reward == no_marker.tool.sim_reward == -2.0
    assert no_answer.state.plan_reward == -2.0 and no_answer.state.board == s0.board
    assert e.team_reward(no_answer.state) == 0.0


def test_move_budget_truncates_with_a_penalty():
    e = env(max_moves=3)
    s0 = e.reset(Problem("c", {"rows": CORRIDOR}), 0)
    t = e.step(s0, PLAN, "U U U U U")
    assert t.truncated and not t.terminated
    assert t.state.plan_reward == pytest.approx(3 * -0.06 - 5.0)


def test_planner_sees_the_tool_code_output_and_actions():
    e = env()
    _, planner = _agents(e)
    s0 = e.reset(Problem("c", {"rows": CORRIDOR}), 0)
    s1 = e.step(s0, TOOL, 'print("**Actions List**: [R, R, R]")').state
    prompt = planner.observe(s1, 0)[-1]["content"]
    assert "**Actions List**" in prompt and "[R, R, R]" in prompt and "solves the puzzle" in prompt
    assert "#@_$_.#" in prompt and "####" in prompt


def test_malformed_rows_are_a_data_error():
    with pytest.raises(DataError):
        env().reset(Problem("bad", {"rows": ["#####", "#@$$.#", "#####"]}), 0)
    with pytest.raises(DataError):
        env().reset(Problem("bad", {"nothing": 1}), 0)


BFS_SOLVER = r'''
import sys
from collections import deque
rows = [r for r in sys.stdin.read().split("\n") if r]
walls, goals, boxes = set(), set(), set()
for r, row in enumerate(rows):
    for c, ch in enumerate(row):
        if ch == "#": walls.add((r, c))
        if ch in ".*+": goals.add((r, c))
        if ch in "$*": boxes.add((r, c))
        if ch in "@+": player = (r, c)
moves = {"U": (-1, 0), "D": (1, 0), "L": (0, -1), "R": (0, 1)}
start = (player, frozenset(boxes))
seen = {start: None}
queue = deque([start])
while queue:
    p, bx = queue.popleft()
    if bx <= goals:
        path = []
        node = (p, bx)
        while seen[node]:
            node, m = seen[node]
            path.append(m)
        print("**Actions List**:", list(reversed(path)))
        break
    for m, (dr, dc) in moves.items():
        t = (p[0] + dr, p[1] + dc)
        if t in walls: continue
        nb = bx
        if t in bx:
            b = (t[0] + dr, t[1] + dc)
            if b in walls or b in bx: continue
            nb = (bx - {t}) | {b}
        if (t, nb) not in seen:
            seen[(t, nb)] = ((p, bx), m)
            queue.append((t, nb))
'''


def test_a_real_bfs_program_in_the_sandbox_solves_a_generated_level():
    e = SokobanEnv(tool_timeout_s=10)
    tool, planner = _agents(e)
    s0 = e.reset(e.example_problems(1)[0], 0)
    s1 = e.step(s0, TOOL, tool.parse(fenced(BFS_SOLVER))).state
    assert s1.tool.verdict == "ok", s1.tool.stdout
    assert s1.tool.sim_solved and s1.tool.sim_reward > 10
    final = e.step(s1, PLAN, planner.parse("I adopt the tool's plan.\n#### " + " ".join(s1.tool.actions)))
    assert final.terminated and e.success(final.state)


def _agents(e):
    from pettingllms.core.registry import make_agents

    agents = make_agents(e)
    return agents[TOOL], agents[PLAN]
