"""docs/distributed.md's table of every shipped script's layout is what the scripts give today."""

from __future__ import annotations

import re

from script_support import ROOT, SCRIPTS_DIR, script_specs

DOC = ROOT / "docs" / "distributed.md"
SETTINGS = {  # column -> the shell a user launches the script from
    "one node, 8 GPUs": {"CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7"},
    "two nodes, 8 GPUs each": {"CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7", "CLUSTER_GPUS": "16"},  # the sbatch
    "CPU": {"GPU_num": "0"},
}


def cell(specs) -> str:
    summaries = [spec.layout.summary() for spec in specs]
    if len(summaries) > 1 and len(set(summaries)) == 1:
        return f"{len(summaries)} x ({summaries[0]})"
    return "; ".join(summaries)


def test_the_layout_table_matches_the_scripts():
    text = DOC.read_text()
    table = text[text.index("<!-- layout-table:start -->"):text.index("<!-- layout-table:end -->")]
    rows = [line for line in table.splitlines() if line.startswith("| `")]
    documented = {re.match(r"\| `([^`]+)`", row).group(1): [c.strip() for c in row.strip("|").split("|")[1:]]
                  for row in rows}
    scripts = sorted(str(p.relative_to(SCRIPTS_DIR)) for p in SCRIPTS_DIR.glob("*/*.sh"))
    assert sorted(documented) == scripts
    header = [c.strip() for c in table.splitlines()[1].strip("|").split("|")[1:]]
    assert header == list(SETTINGS)
    for script in scripts:
        expected = [cell(script_specs(script, env)) for env in SETTINGS.values()]
        assert documented[script] == expected, script
