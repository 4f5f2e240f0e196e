"""Plan-Path: reachable grids with BFS-optimal lengths, move rules, shaping, goal and optimality bonuses."""

from __future__ import annotations

import json

import pytest

from pettingllms.envs.games_common.base import PLAN, TOOL
from pettingllms.envs.games_common.runner import EchoRunner
from pettingllms.envs.plan_path.env import PlanPathEnv, board_from_rows, generate_grid, shortest_path_length
from pettingllms.core import DataError, Problem
from pettingllms.core.checker import check_env

ROOM = ["S..", "##.", "G.."]  # optimal: R R D D L L (6 moves)


def fenced(code: str) -> str:
    return f"Here is my solver.\n```python\n{code}\n```\n"


def env(**kw):
    return PlanPathEnv(runner=EchoRunner(), **kw)


def test_check_env_passes():
    report = check_env(env())
    assert report.ok, report.format()


def test_generated_grids_are_reachable_with_the_bfs_length_and_about_22_percent_walls():
    walls = cells = 0
    for seed in range(100):
        rows, optimal = generate_grid(seed)
        board = board_from_rows(rows)
        assert (board.height, board.width) == (10, 10)
        assert optimal == board.optimal == shortest_path_length(board.walls, 10, 10, board.position, board.goal) >= 1
        walls, cells = walls + len(board.walls), cells + 100
    assert 0.17 < walls / cells < 0.27


def test_seed_spaces_are_disjoint_and_data_is_plain():
    e = env()
    train, test = e.procedural_problems("train", 300), e.procedural_problems("test", 50)
    assert not {p.data["seed"] for p in train} & {p.data["seed"] for p in test}
    test_grids = {tuple(e.puzzle_data(p)["rows"]) for p in test}
    assert len(test_grids) == 50 and not test_grids & {tuple(e.puzzle_data(p)["rows"]) for p in train}
    json.dumps(dict(e.materialize(test[0]).data))


def test_optimal_path_gets_goal_and_optimality_bonuses():
    e = env()
    s0 = e.reset(Problem("room", {"rows": ROOM}), 0)
    t = e.step(s0, PLAN, "[R, R, D, D, L, L]")
    assert t.terminated and e.success(t.state)
    # 6 valid moves at -0.01; shaping 0.1 * (phi_end - phi_start) = 0.1 * (0 - (-2)); goal +1; optimal +0.5
    assert t.state.plan_reward == pytest.approx(6 * -0.01 + 0.2 + 1.0 + 0.5)


def test_a_detour_reaches_the_goal_without_the_optimality_bonus():
    e = env()
    s0 = e.reset(Problem("room", {"rows": ROOM}), 0)
    t = e.step(s0, PLAN, "U R R D D L L")  # one invalid move first
    assert t.terminated
    assert t.state.plan_reward == pytest.approx(-0.1 + 6 * -0.01 + 0.2 + 1.0)


def test_invalid_moves_do_not_move_and_cost_more():
    e = env()
    s0 = e.reset(Problem("room", {"rows": ROOM}), 0)
    t = e.step(s0, PLAN, "[D, L, 'jump']")  # wall, off the grid, not a move
    assert t.state.board.position == s0.board.position and not t.terminated
    assert t.state.plan_reward == pytest.approx(3 * -0.1)


def test_a_non_move_outscores_a_step_away_from_the_goal():
    """The reference's shaping, kept: an invalid move (-0.1) costs less than a valid one away from the goal
    (-0.01 - 0.1), so of the answers that miss, the best paid names no move at all. Learning-claims
    AT-GRPO seed 2 on cpu_plan_path collapsed onto `#### E` (docs/environments/games.md, Rewards)."""
    e = env()
    s0 = e.reset(Problem("room", {"rows": ROOM}), 0)  # G is 2 rows down; R adds 1 to the distance
    # the plan agent hands the env the text after its last ####, so this is the answer `#### E` against `#### R`
    non_move, away = e.step(s0, PLAN, "E").state, e.step(s0, PLAN, "R").state
    assert non_move.board.position == s0.board.position and away.board.position != s0.board.position
    assert non_move.plan_reward == pytest.approx(-0.1) and away.plan_reward == pytest.approx(-0.01 - 0.1)
    assert away.plan_reward < non_move.plan_reward
    assert e.step(s0, PLAN, "R R").state.plan_reward == pytest.approx(2 * -0.01 - 0.2)  # 2 moves away: worse


def test_shaping_rewards_progress_and_sums_over_turns():
    e = env()
    s0 = e.reset(Problem("room", {"rows": ROOM}), 0)
    s1 = e.step(s0, PLAN, "R R").state  # 2 moves, Manhattan distance 2 -> 4
    s2 = e.step(s1, PLAN, "D D L L").state
    assert s1.plan_reward == pytest.approx(2 * -0.01 - 0.2)
    assert e.team_reward(s2) == pytest.approx(s1.plan_reward + s2.plan_reward)
    assert e.success(s2) and s2.plan_reward == pytest.approx(4 * -0.01 + 0.4 + 1.0 + 0.5)


def test_move_budget_truncates():
    e = env(max_moves=4)
    t = e.step(e.reset(Problem("room", {"rows": ROOM}), 0), PLAN, "L L L L L L")
    assert t.truncated and not t.terminated and t.state.plan_reward == pytest.approx(4 * -0.1 - 1.0)


def test_tool_simulation_is_scored_but_the_real_agent_stays():
    e = env()
    s0 = e.reset(Problem("room", {"rows": ROOM}), 0)
    t = e.step(s0, TOOL, "print('**Actions List**: R R D D L L')")
    assert t.state.tool.sim_solved and t.state.tool.sim_reward == pytest.approx(1.64)
    assert t.state.board == s0.board and not t.terminated


@pytest.mark.parametrize("rows", [["S.#", "##G"], ["S..", "..."], ["S.", "G.."], ["SX", ".G"]])
def test_bad_grids_are_data_errors(rows):
    with pytest.raises(DataError):
        env().reset(Problem("bad", {"rows": rows}), 0)


def test_tree_rollout_through_the_executor_groups_and_scores_both_agents(make_executor):
    """The real executor over this env: K=2 branches per (turn, agent), tool branches differ by their simulation."""
    e = env(max_turns=2)

    def script(prompt, k, request):
        if "tool_agent" in request.request_id:
            return fenced("print('**Actions List**: R R D D L L')") if k == 0 else "no code, sorry"
        return "Adopting the tool.\n#### R R D D L L" if k == 0 else "#### U"

    executor, _ = make_executor(e, script, branching=2)
    result = executor.run([Problem("room", {"rows": ROOM})], seeds=[0])
    groups = {}
    for sample in result.samples:
        groups.setdefault(sample.group, []).append(sample)
    assert sorted((g[1], g[2]) for g in groups) == [(0, PLAN), (0, TOOL)]  # solved in turn 0: episode ends
    assert all(len(samples) == 2 for samples in groups.values())
    tool = sorted(s.reward for s in groups[(0, 0, TOOL)])
    assert tool == pytest.approx([-2.0, 1.64])  # team term 0 (real board unmoved) + simulated return
    plan = sorted(s.reward for s in groups[(0, 0, PLAN)])
    assert plan == pytest.approx([2 * -0.1, 2 * 1.64])  # alpha * team + local, both the real step's return
    assert result.episodes[0].success and result.episodes[0].terminated
