"""Write Plan-Path grids: data/plan_path/{train,test}/<name>.parquet (default plan_path_<size>x<size>).

    python scripts/dataprocess/load_plan_path.py [--data-root data] [--size 10] [--wall-prob 0.22] [--train-size 5000] [--test-size 100]

Optional: Plan-Path is procedural by default (no ``env.dataset``). Files pin a fixed benchmark.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from anywhere: the repo root holds pettingllms/envs/

from pettingllms.data.games import base_parser, report, write_game_dataset  # noqa: E402
from pettingllms.envs.plan_path.env import PlanPathEnv  # noqa: E402


def main(argv: list[str] | None = None) -> dict:
    parser = base_parser(__doc__.splitlines()[0], train_size=5000, test_size=100)
    parser.add_argument("--size", type=int, default=10)
    parser.add_argument("--wall-prob", type=float, default=0.22)
    args = parser.parse_args(argv)
    env = PlanPathEnv(size=args.size, wall_prob=args.wall_prob)
    name = args.name or f"plan_path_{args.size}x{args.size}"
    paths = write_game_dataset(env, name, args.data_root, args.train_size, args.test_size)
    report(paths)
    return paths


if __name__ == "__main__":
    main()
