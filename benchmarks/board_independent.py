"""The best answer that ignores the board: a floor a Plan-Path preset's learning must clear to show board reading.

    python benchmarks/board_independent.py                      # cpu_plan_path: every move list up to its budget
    python benchmarks/board_independent.py --preset cpu_plan_path --max-length 4

A small model can raise held-out success without reading the board: on a small grid a fixed tour such as
``U U R R D D`` reaches many goals (a move into the edge is refused, so the tour sweeps the corners). This plays
every move list of 1 to ``--max-length`` moves (default: the preset's move budget ``max_moves``, beyond which
moves are never applied) as the plan agent's answer at every turn, on the preset's held-out grids (the first
``env.max_val_problems`` test seeds, as its validation), through the real env, and reports the best list's success.
A trained policy whose held-out success is above that figure answers differently for different boards.

Writes ``benchmarks/results/board_independent.json``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from pathlib import Path
from typing import Sequence

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _report import RESULTS_DIR  # noqa: E402

MOVES = "UDLR"


def best_fixed_answer(env, problems: Sequence, max_length: int) -> tuple[str, float]:
    """The move list of 1..``max_length`` moves with the highest success over ``problems`` when the plan agent
    gives it at every turn (ties: the shortest, then the first in U, D, L, R order), and that success."""
    starts = [env.reset(problem, 0) for problem in problems]

    def success(answer: str) -> float:
        solved = 0
        for state in starts:
            for _ in range(env.max_turns):
                step = env.step(state, "plan_agent", answer)
                state = step.state
                if step.terminated or step.truncated:
                    break
            solved += env.success(state)
        return solved / len(starts)

    answers = (" ".join(moves) for n in range(1, max_length + 1) for moves in itertools.product(MOVES, repeat=n))
    best, best_success = "", -1.0
    for answer in answers:
        value = success(answer)
        if value > best_success:
            best, best_success = answer, value
    return best, best_success


def main(argv: Sequence[str] | None = None) -> dict:
    from pettingllms.core.registry import get_env_class
    from pettingllms.entry.train import load_config
    from pettingllms.envs.games_common.runner import EchoRunner

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="cpu_plan_path")
    parser.add_argument("--max-length", type=int, help="longest move list tried (default: the preset's max_moves)")
    parser.add_argument("--out-dir", default=str(RESULTS_DIR))
    args = parser.parse_args(argv)
    cfg = load_config("train", [f"+experiment={args.preset}"])
    if cfg.env.name != "plan_path":
        raise SystemExit(f"error: {args.preset} trains {cfg.env.name}; this floor is for Plan-Path presets")
    options = dict(cfg.env.options)
    env = get_env_class(cfg.env.name)(max_turns=cfg.env.max_turns, runner=EchoRunner(), **options)
    max_length = args.max_length or int(options.get("max_moves", 6))
    problems = env.procedural_problems("test", cfg.env.max_val_problems)
    started = time.perf_counter()
    answer, success = best_fixed_answer(env, problems, max_length)
    report = {"benchmark": "board_independent", "command": " ".join(["python", "benchmarks/board_independent.py",
                                                                     *(argv if argv is not None else sys.argv[1:])]),
              "preset": args.preset, "env_options": options, "max_turns": cfg.env.max_turns,
              "held_out_problems": len(problems), "max_length": max_length,
              "answers_tried": sum(len(MOVES) ** n for n in range(1, max_length + 1)),
              "best_answer": answer, "best_success": success, "seconds": round(time.perf_counter() - started, 1)}
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "board_independent.json").write_text(json.dumps(report, indent=1) + "\n")
    print(f"{args.preset}: the best answer that ignores the board, '{answer}', solves {success:.1%} of "
          f"{len(problems)} held-out grids ({report['answers_tried']} move lists of 1-{max_length} moves tried)")
    return report


if __name__ == "__main__":
    main()
