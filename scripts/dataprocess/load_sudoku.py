"""Write Sudoku puzzles with unique solutions: data/sudoku/{train,test}/<name>.parquet (default sudoku_<n>x<n>).

    python scripts/dataprocess/load_sudoku.py [--data-root data] [--size 4|9] [--holes N] [--train-size 5000] [--test-size 100]

Train with ``env.dataset=<name> env.benchmark=[<name>]``. Without ``env.dataset`` the env generates puzzles itself.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from anywhere: the repo root holds pettingllms/envs/

from pettingllms.data.games import base_parser, report, write_game_dataset  # noqa: E402
from pettingllms.envs.sudoku.env import SudokuEnv  # noqa: E402


def main(argv: list[str] | None = None) -> dict:
    parser = base_parser(__doc__.splitlines()[0], train_size=5000, test_size=100)
    parser.add_argument("--size", type=int, default=4, choices=(4, 9))
    parser.add_argument("--holes", type=int, default=None, help="empty cells (default 10 for 4x4, 50 for 9x9)")
    args = parser.parse_args(argv)
    env = SudokuEnv(size=args.size, holes=args.holes)
    name = args.name or f"sudoku_{args.size}x{args.size}"
    paths = write_game_dataset(env, name, args.data_root, args.train_size, args.test_size)
    report(paths)
    return paths


if __name__ == "__main__":
    main()
