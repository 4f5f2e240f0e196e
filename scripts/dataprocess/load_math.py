#!/usr/bin/env python
"""Prepare math datasets: data/math/{train,test}/<name>.parquet. See docs/datasets.md.

    python scripts/dataprocess/load_math.py                                   # offline: reasoning-gym sets
    python scripts/dataprocess/load_math.py --paper                           # polaris + AIME24 + AIME25 (hub)
    python scripts/dataprocess/load_math.py --sources aime_past,AIME24 --hub-cache ./raw
    python scripts/dataprocess/load_math.py --from-file my.jsonl --name mine --split train
    python scripts/dataprocess/load_math.py --mix polaris=0.7,dapo_math=0.3 --mix-name mix --mix-size 5000
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from a checkout without installing

from pettingllms.data.loader import main  # noqa: E402
from pettingllms.data.math_sources import domain_spec  # noqa: E402

if __name__ == "__main__":
    main(domain_spec())
