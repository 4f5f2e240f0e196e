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


def test_the_memory_plan_example_is_what_the_plan_prints(monkeypatch):
    """The GPU memory plan block of docs/distributed.md: every ``label  N GB`` line is the plan's own figure for the
    command written above it (math_L1_prompt on 8 GPUs of 80 GB), and so are the fixes the prose quotes."""
    import pytest

    from pettingllms.assembly.plan import plan
    from pettingllms.core import ConfigError
    from pettingllms.entry.train import load_config

    monkeypatch.setenv("RAY_ADDRESS", "auto")
    text = DOC.read_text()
    block = text[text.index("CLUSTER_GPUS=8 RAY_ADDRESS=auto bash scripts/train/math/math_L1_prompt.sh --dry-run"):]
    block = block[:block.index("```")]
    figure = re.compile(r"^\s+(\S.*?)\s{2,}([\d.]+) GB\b", re.M)
    documented = figure.findall(block)
    assert len(documented) >= 15
    common = ["training.experiment_name=math_L1_prompt", "specialization=L1", "resources.gpus_per_policy=8"]
    printed = plan(load_config("math", [*common, "resources.gpu_memory_gb=80"])).memory.describe()
    assert documented == [pair for pair in figure.findall(printed) if pair[0] in dict(documented)]
    with pytest.raises(ConfigError) as refused:
        plan(load_config("math", [*common, "resources.gpu_memory_gb=8"]))
    fixes = dict(re.findall(r"^  (\S+?)[ :].*?peak ([\d.]+) GB", str(refused.value), re.M))
    prose = " ".join(text.split())
    for key, quoted, peak in (("optim.gradient_checkpointing=true", "`optim.gradient_checkpointing=true` (", "36.21"),
                              ("optim.logprob_chunk_tokens=1024", "`optim.logprob_chunk_tokens=1024` (", "39.59"),
                              ("optim.micro_batch_max_tokens=6144", "`optim.micro_batch_max_tokens=6144` (", "49.28"),
                              ("specialization=L2", "`specialization=L2` (LoRA, ", "52.57"),
                              ("base_models.policy_0.fsdp.cpu_offload=true", "`fsdp.cpu_offload=true` (", "59.21"),
                              ("GPU_num=64", "`GPU_num=64` (", "59.67")):
        assert fixes[key] == peak and f"{quoted}{peak} GB" in prose
