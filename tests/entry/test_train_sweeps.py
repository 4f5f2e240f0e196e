"""``pettingllms train --multirun``: Hydra's sweep expansion, validation of every job first, one run dir per job."""

from __future__ import annotations

import json

import pytest
import yaml

from pettingllms.cli import main
from pettingllms.core import ConfigError
from pettingllms.entry.train import expand_sweep, split_flags, swept_keys

# One step of the toy env on the 3.2M random model, in-process: about 2 s per job once torch is warm.
TINY_RUN = [
    "base_models.policy_0.path=tiny-random-smollm2", "env.name=toy_targets", "env.max_turns=1",
    "training.total_training_steps=1", "training.train_batch_size=1", "training.max_response_length=5",
    "training.val_freq=0", "training.export_hf=false", "training.plot=false", "rollout.branching=2",
    "resources.use_ray=false",
]


def test_expansion_is_hydras_cartesian_product_in_command_line_order():
    jobs = expand_sweep(["optim.lr=1e-5,2e-5", "rollout.branching=range(2,4)", "training.seed=7"])
    assert jobs == [
        ["optim.lr=1e-05", "rollout.branching=2", "training.seed=7"],
        ["optim.lr=1e-05", "rollout.branching=3", "training.seed=7"],
        ["optim.lr=2e-05", "rollout.branching=2", "training.seed=7"],
        ["optim.lr=2e-05", "rollout.branching=3", "training.seed=7"],
    ]
    assert swept_keys(jobs) == ["optim.lr", "rollout.branching"]


def test_expansion_keeps_lists_quoted_commas_and_config_groups_apart():
    jobs = expand_sweep(["env.benchmark=[a,b]", "training.experiment_name='x,y'",
                         "+experiment=quick_test,paper_math", "specialization=choice(L1,L2)"])
    assert len(jobs) == 4
    assert all("env.benchmark=[a,b]" in job and "training.experiment_name='x,y'" in job for job in jobs)
    assert [job[2:] for job in jobs] == [
        ["+experiment=quick_test", "specialization=L1"], ["+experiment=quick_test", "specialization=L2"],
        ["+experiment=paper_math", "specialization=L1"], ["+experiment=paper_math", "specialization=L2"],
    ]
    assert expand_sweep([]) == [[]]  # no overrides: one job


def test_bad_sweep_syntax_is_a_config_error():
    with pytest.raises(ConfigError, match="cannot expand the sweep"):
        expand_sweep(["optim.lr=range(1,"])


def test_flags_are_split_from_overrides():
    assert split_flags(["-m", "a=1,2", "--dry-run"]) == (True, True, ["a=1,2"])
    assert split_flags(["a=1"]) == (False, False, ["a=1"])


def test_dry_run_composes_every_job_and_trains_nothing(tmp_path, capsys):
    code = main(["train", "--multirun", "--dry-run", "+experiment=quick_test", "optim.lr=1e-5,2e-5",
                 "rollout.branching=2,3", f"training.log_dir={tmp_path}"])
    out = capsys.readouterr().out
    assert code == 0
    assert "4 job(s)" in out and "['optim.lr', 'rollout.branching']" in out
    assert "job 3: +experiment=quick_test optim.lr=2e-05 rollout.branching=3" in out
    assert not list(tmp_path.iterdir())


def test_a_bad_job_fails_the_sweep_before_anything_trains(tmp_path, capsys):
    code = main(["train", "--multirun", "+experiment=quick_test", "rollout.branching=2,many",
                 f"training.log_dir={tmp_path}"])
    assert code == 2
    err = capsys.readouterr().err
    assert "multirun job 1 (+experiment=quick_test rollout.branching=many" in err and "Error merging" in err
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("override,match", [
    ("training.log_dir=a,b", "log_dir cannot be swept"),
    ("training.resume=/some/checkpoint", "cannot be combined with --multirun"),
])
def test_sweeps_that_would_share_a_run_are_refused(override, match):
    with pytest.raises(ConfigError, match=match):
        from pettingllms.entry.train import run_multirun

        run_multirun("train", ["+experiment=quick_test", override], dry_run=True)


def test_two_job_sweep_trains_each_in_its_own_run_dir(tmp_path, capsys):
    code = main(["train", "--multirun", *TINY_RUN, "optim.lr=1e-5,2e-5", f"training.log_dir={tmp_path}"])
    out = capsys.readouterr().out
    assert code == 0
    (root,) = tmp_path.glob("multirun/*/*")
    jobs = [json.loads(line) for line in (root / "jobs.jsonl").read_text().splitlines()]
    assert [(j["job"], j["status"], j["steps"]) for j in jobs] == [(0, "ok", 1), (1, "ok", 1)]
    run_dirs = [j["run_dir"] for j in jobs]
    assert run_dirs[0].startswith(str(root / "0")) and run_dirs[1].startswith(str(root / "1"))
    lrs = [yaml.safe_load(open(f"{d}/config.yaml"))["optim"]["lr"] for d in run_dirs]
    assert lrs == [1e-5, 2e-5]
    assert all("reward" in j["headline"] and "episode/success_rate" in j["headline"] for j in jobs)
    assert "multirun summary: 2 job(s), 2 ok" in out and "optim.lr" in out and run_dirs[1] in out
