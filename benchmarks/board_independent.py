"""The best answer that ignores the board: the floor a preset's learning must clear to show answers that follow it.

    python benchmarks/board_independent.py                      # cpu_plan_path: every move list up to its budget
    python benchmarks/board_independent.py --preset cpu_plan_path --max-length 4
    python benchmarks/board_independent.py --preset cpu_sokoban  # the same search over Sokoban's moves
    python benchmarks/board_independent.py --preset cpu_sudoku  # the best fixed grid

A small model can raise held-out success without reading the board: on a small grid a fixed tour such as
``U U R R D D`` reaches many goals (a move into the edge is refused, so the tour sweeps the corners), and on a
small Sokoban room many boxes are one push from their goal. This plays
every move list of 1 to ``--max-length`` moves (default: the preset's move budget ``max_moves``, beyond which
moves are never applied) as the plan agent's answer at every turn, on the preset's held-out grids (the first
``env.max_val_problems`` test seeds, as its validation), through the real env, and reports the best list's success.
A trained policy whose held-out success is above that figure answers differently for different boards.

Sudoku: a fixed answer can be a whole grid. Its fills on clues are refused, so it solves a one-hole puzzle exactly
when its digit at the hole is the solution's, and a second turn repeating it changes nothing. The best fixed grid
takes, cell by cell, the digit most often right over the held-out puzzles whose hole is there. It is played through
the env to check. Both floors are picked on the held-out set itself, so they bound any fixed answer from above; for
Sudoku that bound is loose (about 4 held-out puzzles per cell), so the grid picked on 4,096 training puzzles, the
most a fixed answer learned in training could hold, is reported beside it.

Writes ``benchmarks/results/board_independent_<preset>.json``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Sequence

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _report import RESULTS_DIR, out_dir  # noqa: E402

MOVES = "UDLR"
MOVE_GAMES = ("plan_path", "sokoban")  # answers are move lists, capped by the env's max_moves
MAX_SEARCHED = 8  # longest move list tried (4^8 = 65,536 lists)
TRAIN_PICK = 4096  # Sudoku: training puzzles a fixed grid is picked on (the held-out pick is an upper bound)


def best_fixed_answer(env, problems: Sequence, max_length: int) -> tuple[str, float]:
    """The move list of 1..``max_length`` moves with the highest success over ``problems`` when the plan agent
    gives it at every turn (ties: the shortest, then the first in U, D, L, R order), and that success."""
    starts = [env.reset(problem, 0) for problem in problems]
    answers = (" ".join(moves) for n in range(1, max_length + 1) for moves in itertools.product(MOVES, repeat=n))
    best, best_success = "", -1.0
    for answer in answers:
        value = success(env, starts, answer)
        if value > best_success:
            best, best_success = answer, value
    return best, best_success


def best_fixed_grid(env, pick: Sequence, problems: Sequence) -> tuple[str, float]:
    """The fixed whole-grid answer that solves the most one-hole Sudoku puzzles of ``pick``, and its success on
    ``problems`` (played through ``env``: each turn gives the same grid)."""
    if not pick or not problems:
        raise ValueError("best_fixed_grid needs puzzles to pick on and to play")
    votes: dict[tuple[int, int], Counter] = {}
    n = 0
    for problem in pick:
        board = env.reset(problem, 0).board
        n = board.size
        holes = [(r, c) for r in range(n) for c in range(n) if not board.clues[r][c]]
        if len(holes) != 1:
            raise SystemExit(f"error: the fixed-grid floor is for one-hole puzzles; {len(holes)} holes here")
        (r, c), = holes
        votes.setdefault((r, c), Counter())[board.solution[r][c]] += 1
    grid = [[votes[(r, c)].most_common(1)[0][0] if (r, c) in votes else 1 for c in range(n)] for r in range(n)]
    answer = "[" + ", ".join("[" + ", ".join(map(str, row)) + "]" for row in grid) + "]"
    return answer, success(env, [env.reset(problem, 0) for problem in problems], answer)


def success(env, starts: Sequence, answer: str) -> float:
    """The share of episodes from ``starts`` solved when the plan agent gives ``answer`` at every turn."""
    solved = 0
    for state in starts:
        for _ in range(env.max_turns):
            step = env.step(state, "plan_agent", answer)
            state = step.state
            if step.terminated or step.truncated:
                break
        solved += env.success(state)
    return solved / len(starts)


def main(argv: Sequence[str] | None = None) -> dict:
    from pettingllms.core.registry import get_env_class
    from pettingllms.entry.train import load_config
    from pettingllms.envs.games_common.runner import EchoRunner

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="cpu_plan_path")
    parser.add_argument("--max-length", type=int, help="longest move list tried (default: the preset's max_moves)")
    parser.add_argument("--out-dir")
    parser.add_argument("--quick", action="store_true", help="move lists of at most 2 moves, to a temp folder")
    args = parser.parse_args(argv)
    if args.quick:
        args.max_length = args.max_length or 2
    cfg = load_config("train", [f"+experiment={args.preset}"])
    options = dict(cfg.env.options)
    env = get_env_class(cfg.env.name)(max_turns=cfg.env.max_turns, runner=EchoRunner(), **options)
    problems = env.procedural_problems("test", cfg.env.max_val_problems)
    started = time.perf_counter()
    if cfg.env.name in MOVE_GAMES:
        max_length = args.max_length or env.game.max_moves
        if max_length > MAX_SEARCHED:
            raise SystemExit(f"error: {args.preset}'s move budget is {max_length}: 4^{max_length} move lists are "
                             f"too many to try; give --max-length (at most {MAX_SEARCHED})")
        answer, floor = best_fixed_answer(env, problems, max_length)
        tried = {"max_length": max_length, "answers_tried": sum(len(MOVES) ** n for n in range(1, max_length + 1))}
        what = f"{tried['answers_tried']} move lists of 1-{max_length} moves tried"
    elif cfg.env.name == "sudoku":
        answer, floor = best_fixed_grid(env, problems, problems)
        learnable, learnable_floor = best_fixed_grid(env, env.procedural_problems("train", TRAIN_PICK), problems)
        tried = {"train_picked_answer": learnable, "train_picked_success": learnable_floor, "train_pick": TRAIN_PICK}
        what = (f"the best fixed grid, cell by cell; the grid best on {TRAIN_PICK} training puzzles, the most a fixed "
                f"answer learned in training could hold, solves {learnable_floor:.1%}")
    else:
        raise SystemExit(f"error: {args.preset} trains {cfg.env.name}; this floor is for Plan-Path, Sokoban and Sudoku")
    report = {"benchmark": "board_independent", "command": " ".join(["python", "benchmarks/board_independent.py",
                                                                     *(argv if argv is not None else sys.argv[1:])]),
              "preset": args.preset, "env": cfg.env.name, "env_options": options, "max_turns": cfg.env.max_turns,
              "held_out_problems": len(problems), **tried,
              "best_answer": answer, "best_success": floor, "seconds": round(time.perf_counter() - started, 1)}
    out = out_dir(args.out_dir, args.quick)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"board_independent_{args.preset}.json").write_text(json.dumps(report, indent=1) + "\n")
    print(f"{args.preset}: the best answer that ignores the board, '{answer}', solves {floor:.1%} of "
          f"{len(problems)} held-out puzzles ({what})")
    return report


if __name__ == "__main__":
    main()
