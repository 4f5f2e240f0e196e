"""Dataset preparation: hub, offline and local sources converted into ``data/<domain>/{train,test}/<name>.parquet``.

``sources`` holds what every domain shares (reading files and hub datasets, writing parquet, mixtures,
decontamination); ``math_sources`` and ``code_sources`` hold the per-dataset converters. The CLIs are
``scripts/dataprocess/load_math.py`` and ``load_code.py``; see docs/datasets.md.
"""
