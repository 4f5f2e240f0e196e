"""Write Sokoban levels: data/sokoban/{train,test}/<name>.parquet (default name sokoban_<size>x<size>_b<boxes>).

    python scripts/dataprocess/load_sokoban.py [--data-root data] [--size 6] [--boxes 1] [--train-size 5000] [--test-size 100]

Train with ``env.dataset=<name> env.benchmark=[<name>]``. Without ``env.dataset`` the env generates levels itself.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from anywhere: the repo root holds pettingllms/envs/

from pettingllms.data.games import base_parser, report, write_game_dataset  # noqa: E402
from pettingllms.envs.sokoban.env import SokobanEnv  # noqa: E402


def main(argv: list[str] | None = None) -> dict:
    parser = base_parser(__doc__.splitlines()[0], train_size=5000, test_size=100)
    parser.add_argument("--size", type=int, default=6)
    parser.add_argument("--boxes", type=int, default=1)
    args = parser.parse_args(argv)
    env = SokobanEnv(size=args.size, boxes=args.boxes)
    name = args.name or f"sokoban_{args.size}x{args.size}_b{args.boxes}"
    paths = write_game_dataset(env, name, args.data_root, args.train_size, args.test_size)
    report(paths)
    return paths


if __name__ == "__main__":
    main()
