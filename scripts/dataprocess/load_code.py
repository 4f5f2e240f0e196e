#!/usr/bin/env python
"""Prepare code datasets: data/code/{train,test}/<name>.parquet. See docs/datasets.md.

    python scripts/dataprocess/load_code.py                                   # offline: HumanEval (stdin/stdout form)
    python scripts/dataprocess/load_code.py --paper                           # code_contests, APPS, LiveCodeBench (hub)
    python scripts/dataprocess/load_code.py --sources apps_test --hub-cache ./raw
    python scripts/dataprocess/load_code.py --from-file my.jsonl --name mine --split test
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from a checkout without installing

from pettingllms.data.code_sources import domain_spec  # noqa: E402
from pettingllms.data.loader import main  # noqa: E402

if __name__ == "__main__":
    main(domain_spec())
