"""The acceptance run: ``pettingllms eval`` on the embedded default model (SmolLM2-135M-Instruct), offline, on 4
math and 4 code problems, two sampled episodes each (pass@1, pass@2), one turn of each multi-agent workflow.
Slow (minutes on a 2-core CPU): ``pytest -m slow``."""

from __future__ import annotations

import json

import pytest

from pettingllms.entry.eval import eval_command
from eval_support import check_records_against_summary, only_run_dir


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_embedded_default_on_math_and_code(data_root, tmp_path, capsys):
    code = eval_command([
        f"env.data_root={data_root}", "env.max_val_problems=4", "env.max_turns=1",
        "eval.n=2", "eval.k=[1,2]", "eval.temperature=0.7", "eval.max_tokens=256", f"eval.log_dir={tmp_path}",
    ])
    out = capsys.readouterr().out
    assert code == 0
    run_dir = only_run_dir(tmp_path)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["model"]["policies"]["policy_0"]["model"] == "smollm2-135m-instruct"
    assert list(summary["benchmarks"]) == ["math/gsm_symbolic", "code/humaneval"]
    check_records_against_summary(run_dir, summary)
    for key, bench in summary["benchmarks"].items():
        assert bench["problems"] == 4 and bench["samples"] == 8 and bench["failed_generation_ratio"] == 0
        assert bench["pass@1"] <= bench["pass@2"]
        print(key, {k: v for k, v in bench.items() if k.startswith("pass@") or k in ("success_by_turn", "elapsed_s")})
    with capsys.disabled():
        print(out)
