"""benchmarks/learning_claims.py without training: its protocols, the runs it keeps and reuses, the paired summary,
the figure, and the envs it accepts."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import learning_claims as lc  # noqa: E402


def fake_run(method: str, seed: int, auc: float, log_dir: Path, protocol=lc.PAIRED) -> dict:
    """A run record as run() makes it, with made-up held-out values (the code under test reads only these)."""
    return {"method": method, "seed": seed, "env": "vault", "steps": 8, "tokens": 3100,
            "curve": [(0, 0.25), (1050, auc), (2020, auc), (3100, auc)], "problems": [32, 32, 32, 64],
            "auc": auc, "final": auc, "seconds": 1.0, "eval_seconds": 0.5,
            "overrides": lc._overrides(method, seed, protocol, "vault", log_dir)}


def test_paired_protocol_is_the_pre_registered_one():
    p = lc.PAIRED
    assert p.seeds == tuple(range(16)) and p.budget == 3000 and p.eval_at == (1000, 2000)
    assert (p.start_problems, p.mid_problems, p.end_problems) == (32, 32, 64) and p.rule == "paired_bootstrap"
    # the held-out set is the largest evaluation; smaller ones are its first problems
    overrides = lc._overrides("at_grpo", 3, p, "vault", Path("logs"))
    assert "env.max_val_problems=64" in overrides and "training.seed=3" in overrides
    # the methods differ only in their own overrides: everything else is the same list for every seed s
    common = [{o for o in lc._overrides(m, 3, p, "vault", Path("logs")) if not o.startswith("training.experiment_name")}
              - set(lc.VAULT.methods()[m]) for m in lc.VAULT.methods()]
    assert common[0] == common[1] == common[2]


def test_the_first_protocol_runs_as_pre_registration_1_was_run():
    overrides = lc._overrides("trajectory", 1, lc.FIRST, "vault", Path("logs"))
    assert "env.max_val_problems=64" in overrides and "optim.min_lr_ratio=1.0" in overrides
    assert not any(o.startswith("optim.micro_batch_max_tokens") for o in overrides)
    assert lc.FIRST.eval_at == (600, 1200, 1800, 2400) and lc.FIRST.seeds == (0, 1, 2)


def test_finished_runs_are_reused_only_under_the_same_protocol_and_env(tmp_path):
    record = tmp_path / "runs.jsonl"
    lc.append_run(record, fake_run("at_grpo", 0, 0.5, tmp_path), lc.PAIRED)
    lc.append_run(record, fake_run("trajectory", 0, 0.4, tmp_path, lc.FIRST), lc.FIRST)
    done = lc.finished_runs(record, lc.PAIRED, "vault")
    assert list(done) == [("at_grpo", 0)] and done[("at_grpo", 0)]["auc"] == 0.5
    assert list(lc.finished_runs(record, lc.FIRST, "vault")) == [("trajectory", 0)]
    assert lc.finished_runs(record, lc.QUICK, "vault") == {}
    assert lc.finished_runs(tmp_path / "none.jsonl", lc.PAIRED, "vault") == {}


def test_a_committed_record_resumes_runs_whose_files_went_elsewhere(tmp_path):
    # a comparison run in pieces across machines keeps its record in benchmarks/results (--record), its run
    # directories under each machine's logs/
    record = tmp_path / "results" / "runs.jsonl"
    lc.append_run(record, fake_run("trajectory", 2, 0.4, tmp_path / "elsewhere"), lc.PAIRED)
    assert list(lc.finished_runs(record, lc.PAIRED, "vault")) == [("trajectory", 2)]
    changed = fake_run("at_grpo", 2, 0.4, tmp_path)
    changed["overrides"] = [*changed["overrides"], "optim.lr=1e-4"]  # another setting: not the same run
    lc.append_run(record, changed, lc.PAIRED)
    assert list(lc.finished_runs(record, lc.PAIRED, "vault")) == [("trajectory", 2)]


def test_a_run_whose_config_resolved_differently_is_not_resumed(tmp_path):
    # the same override strings can resolve to another config once a preset or a default changes
    record = tmp_path / "runs.jsonl"
    same = fake_run("at_grpo", 1, 0.5, tmp_path)
    same["config_fingerprint"] = lc.fingerprint(same["overrides"])
    assert same["config_fingerprint"] == lc.fingerprint(lc._overrides("at_grpo", 1, lc.PAIRED, "vault",
                                                                      tmp_path / "elsewhere"))
    stale = {**fake_run("trajectory", 1, 0.4, tmp_path), "config_fingerprint": "0" * 16}
    lc.append_run(record, same, lc.PAIRED)
    lc.append_run(record, stale, lc.PAIRED)
    assert list(lc.finished_runs(record, lc.PAIRED, "vault")) == [("at_grpo", 1)]


def test_summary_pairs_seeds_and_decides_by_the_interval(tmp_path):
    protocol = dataclasses.replace(lc.PAIRED, seeds=tuple(range(8)))  # 8 seeds: the exact bootstrap, fast
    at = [0.9, 0.8, 0.7, 0.9, 0.6, 0.8, 0.7, 0.9]
    trajectory = [a - 0.2 for a in at]  # 0.2 lower on every seed: the interval is [0.2, 0.2]
    single = [0.9, 0.1, 0.9, 0.1, 0.9, 0.1, 0.9, 0.1]  # differences from -0.3 to +0.8: 0 inside the interval
    runs = [fake_run(m, s, v[s], tmp_path) for m, v in (("at_grpo", at), ("trajectory", trajectory),
                                                       ("single_agent", single)) for s in range(8)]
    summary = lc.summarize(runs, protocol)
    versus_trajectory = summary["comparisons"]["at_grpo - trajectory (auc)"]
    assert versus_trajectory["pairs"] == 8 and versus_trajectory["above"] == 8
    assert versus_trajectory["low"] == pytest.approx(0.2) and versus_trajectory["verdict"] == "at_grpo better"
    versus_single = summary["comparisons"]["at_grpo - single_agent (auc)"]
    assert versus_single["low"] <= 0 < versus_single["high"] and versus_single["verdict"] == "not separated"
    part = lc.summarize([r for r in runs if r["seed"] < 5], protocol)
    assert part["comparisons"]["at_grpo - trajectory (auc)"]["verdict"] == "no decision: 5 of 8 paired seeds"
    # the figure: a panel per method and one of the differences
    lc.plot(runs, summary["comparisons"], tmp_path / "fig.png", "test")
    assert (tmp_path / "fig.png").stat().st_size > 10_000


def test_env_is_vault_or_a_cpu_preset_and_only_pre_registered_comparisons_run_in_full(tmp_path, monkeypatch, capsys):
    with pytest.raises(SystemExit, match="--env cpu_nothing: not vault or a cpu_<env> preset"):
        lc.task("cpu_nothing")
    monkeypatch.setattr(lc, "EXPERIMENTS", tmp_path)
    (tmp_path / "cpu_game.yaml").write_text("# @package _global_\n")
    game = lc.task("cpu_game")
    assert game.overrides == ("+experiment=cpu_game",)
    assert game.methods()["single_agent"][:2] == ["specialization=L0", "env.agents=[plan_agent]"]
    with pytest.raises(SystemExit, match="--env cpu_game has no pre-registered comparison under --protocol paired"):
        lc.main(["--env", "cpu_game", "--log-dir", str(tmp_path / "logs"), "--out-dir", str(tmp_path)])
    assert not (tmp_path / "logs").exists()


def test_a_finished_run_is_read_back_as_written(tmp_path):
    run = fake_run("single_agent", 5, 0.3, tmp_path)
    lc.append_run(tmp_path / "runs.jsonl", run, lc.PAIRED)
    line = json.loads((tmp_path / "runs.jsonl").read_text())
    assert line["protocol"]["budget"] == 3000 and line["protocol"]["seeds"] == list(range(16))
    assert lc.finished_runs(tmp_path / "runs.jsonl", lc.PAIRED, "vault")[("single_agent", 5)] == \
        json.loads(json.dumps(run))


def test_the_plan_path_comparison_is_registered_for_its_two_methods_only(tmp_path):
    from pettingllms.entry.train import load_config

    assert ("paired_game", "cpu_plan_path") in lc.REGISTERED
    p = lc.GAME_PAIRED
    assert (p.budget, p.eval_at, p.start_problems, p.mid_problems, p.end_problems) == (1500, (500, 1000), 32, 32, 64)
    assert p.seeds == tuple(range(8)) and p.rule == "paired_bootstrap"
    from pettingllms.config.load import to_dict

    resolved = {}
    for method in lc.PROTOCOL_METHODS["paired_game"]:
        cfg = load_config("train", lc._overrides(method, 3, p, "cpu_plan_path", tmp_path))
        assert list(cfg.env.agents) == ["plan_agent"] and cfg.env.options["max_moves"] == 6
        assert cfg.training.seed == 3 and cfg.env.max_val_problems == 64 and cfg.specialization == "L0"
        resolved[method] = to_dict(cfg)
    tree, trajectory = resolved["at_grpo"], resolved["trajectory"]
    assert (tree["rollout"].pop("mode"), trajectory["rollout"].pop("mode")) == ("tree", "trajectory")
    for config in (tree, trajectory):
        config["training"].pop("experiment_name")
    assert tree == trajectory  # the grouping is the only difference
    with pytest.raises(SystemExit, match="--protocol paired_game compares at_grpo, trajectory only"):
        lc.main(["--protocol", "paired_game", "--env", "cpu_plan_path", "--methods", "single_agent",
                 "--log-dir", str(tmp_path / "logs"), "--out-dir", str(tmp_path)])
    assert not (tmp_path / "logs").exists()


RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results"
COMMITTED = [("paired", "vault", "learning_claims_paired_vault"), ("early", "vault", "learning_claims_early_vault"),
             ("paired_game", "cpu_plan_path", "learning_claims_paired_game_cpu_plan_path"),
             ("paired_outcome", "cpu_tictactoe", "learning_claims_paired_outcome_cpu_tictactoe")]


@pytest.mark.parametrize("protocol_name,env,name", COMMITTED)
def test_a_committed_comparison_is_what_its_committed_runs_give(protocol_name, env, name):
    """Every pre-registered (method, seed) run is in the committed record and still resumes under today's code
    (a config change that would silently re-run them fails here), and the committed report, its verdicts and the
    figures in docs/results.md are what the summary of those runs gives."""
    protocol = lc.PROTOCOLS[protocol_name]
    runs = lc.finished_runs(RESULTS / f"{name}_runs.jsonl", protocol, env)
    methods = lc.PROTOCOL_METHODS.get(protocol_name, tuple(lc.VAULT.methods()))
    assert set(runs) == {(m, s) for m in methods for s in protocol.seeds}
    summary = lc.summarize(list(runs.values()), protocol)
    report = json.loads((RESULTS / f"{name}.json").read_text())
    readme = (RESULTS.parents[1] / "docs" / "results.md").read_text()  # every figure lives there
    assert report["comparisons"].keys() == summary["comparisons"].keys()
    for key, mine in summary["comparisons"].items():
        committed = report["comparisons"][key]
        assert committed["verdict"] == mine["verdict"] and not mine["verdict"].startswith("no decision")
        for field in ("mean", "low", "high"):
            assert committed[field] == pytest.approx(mine[field], abs=1e-12)
        if key.endswith("(auc)"):  # the primary metric's figures as docs/results.md states them
            assert f"{mine['mean']:+.3f}" in readme and f"[{mine['low']:+.3f}, {mine['high']:+.3f}]" in readme


def test_the_early_lead_is_registered_on_fresh_seeds_for_two_methods_with_pre_registration_2s_training():
    p = lc.EARLY
    assert ("early", "vault") in lc.REGISTERED and lc.PROTOCOL_METHODS["early"] == ("at_grpo", "trajectory")
    assert (p.budget, p.eval_at, p.start_problems, p.end_problems, p.rule) == (1000, (), 32, 64, "paired_bootstrap")
    assert p.seeds == tuple(range(16, 32)) and not set(p.seeds) & set(lc.PAIRED.seeds)
    for method in ("at_grpo", "trajectory"):  # the same training as pre-registration 2's runs, seed for seed
        early, paired = (lc._overrides(method, 20, q, "vault", Path("logs")) for q in (lc.EARLY, lc.PAIRED))
        assert early == paired
