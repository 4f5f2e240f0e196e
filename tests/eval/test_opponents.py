"""``model.opponent``: a game run evaluated from both seats against the base model, another checkpoint and a real
OpenAI-compatible server; each pass's requests reach the right weights; bad opponents fail before any model loads."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from completions_server import CompletionsServer
from eval_support import read_jsonl
from pettingllms.core import ConfigError
from pettingllms.entry.eval import run_eval
from pettingllms.eval.opponents import PREFIX, seatings
from pettingllms.rollout.executor import AgentSpec

GAME = ["env.name=openspiel", "env.options.game=tic_tac_toe"]
TRAIN = ["base_models.policy_0.path=tiny-random-smollm2", "training.total_training_steps=1",
         "training.train_batch_size=2", "rollout.branching=2", "training.max_response_length=8",
         "training.max_prompt_length=2048", "training.val_freq=0", "training.val_before_train=false",
         "training.export_hf=false", "training.plot=false", "resources.use_ray=false", "env.max_turns=6"]
EVAL = ["env.max_val_problems=3", "eval.n=2", "eval.temperature=1.0", "eval.max_tokens=8"]


@pytest.fixture(scope="module")
def game_run(tmp_path_factory) -> Path:
    from pettingllms.entry.train import run_training

    trainer, _ = run_training("train", [*TRAIN, *GAME, f"training.log_dir={tmp_path_factory.mktemp('train')}"])
    return Path(trainer.run_dir)


def _seat_passes(summary: dict) -> dict[str, dict]:
    return {key: b for key, b in summary["benchmarks"].items() if "seat" in b}


def test_a_checkpoint_plays_the_base_model_from_both_seats(game_run, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")  # rich's tables, unwrapped
    result = run_eval("eval", [f"model.checkpoint={game_run}", "model.opponent=base", *EVAL,
                               f"eval.log_dir={tmp_path}"], print_table=True)
    summary = result.summary
    passes = _seat_passes(summary)
    assert set(passes) == {"openspiel/procedural@player_0", "openspiel/procedural@player_1"}
    for key, b in passes.items():
        seat = key.rsplit("@", 1)[1]
        assert b["seat"] == seat and b["seats"][seat]["games"] == 6  # 3 problems x 2 samples
        records = read_jsonl(result.run_dir / b["records"])
        assert len(records) == 3
    assert summary["model"]["opponent"] == "base"
    described = summary["model"]["policies"]
    assert "trained" not in described[PREFIX + "policy_0"]["weights"]  # the base model's folder
    assert "trained weights" in described["policy_0"]["weights"]
    out = capsys.readouterr().out
    assert "player_0 (evaluated)" in out and "player_1 (opponent)" in out


def test_an_opponent_checkpoint_and_a_served_opponent(game_run, tmp_path, tiny_engine, tiny_codec):
    step = game_run / "checkpoints" / "step_000001"
    against_itself = run_eval("eval", [f"model.checkpoint={game_run}", f"model.opponent={step}", *EVAL,
                                       f"eval.log_dir={tmp_path / 'self'}"], print_table=False)
    described = against_itself.summary["model"]["policies"]
    assert "trained weights" in described[PREFIX + "policy_0"]["weights"]
    with CompletionsServer(tiny_engine, tiny_codec.tokenizer, name="tiny-random-smollm2") as server:
        served = run_eval("eval", [f"model.checkpoint={game_run}", f"model.opponent={server.url}", *EVAL,
                                   f"eval.log_dir={tmp_path / 'served'}"], print_table=False)
        requests = len(server.bodies)
    assert served.summary["server"][PREFIX + "policy_0"]["failed_requests"] == 0
    # Only the opponent's moves reach the server: each pass's opponent seat moves at least once per game.
    opponent_moves = sum(record_turns(served.run_dir, b, b["seat"], opponent=True)
                         for b in _seat_passes(served.summary).values())
    assert requests - 1 == served.summary["server"][PREFIX + "policy_0"]["requests"] == opponent_moves > 0


def record_turns(run_dir: Path, bench: dict, seat: str, opponent: bool) -> int:
    """Actions taken by the opponent's agents (``opponent``) or by ``seat`` in a pass's records."""
    count = 0
    for record in read_jsonl(run_dir / bench["records"]):
        for sample in record["samples"]:
            count += sum((step["agent"] != seat) == opponent for step in sample["steps"])
    return count


def test_bad_opponents_fail_before_any_model_loads(game_run, tmp_path):
    with pytest.raises(ConfigError, match="model.opponent=.* is neither a trainer run directory"):
        run_eval("eval", [f"model.checkpoint={game_run}", f"model.opponent={tmp_path / 'nowhere'}", *EVAL,
                          f"eval.log_dir={tmp_path}"], print_table=False)
    other = tmp_path / "other_run"
    other.mkdir()
    config = yaml.safe_load((game_run / "config.yaml").read_text())
    config["base_models"]["policy_0"]["path"] = "smollm2-135m-instruct"
    (other / "config.yaml").write_text(yaml.safe_dump(config))
    shutil.copytree(game_run / "checkpoints", other / "checkpoints")
    with pytest.raises(ConfigError, match="other base models: policy_0: smollm2-135m-instruct"):
        run_eval("eval", [f"model.checkpoint={game_run}", f"model.opponent={other}", *EVAL,
                          f"eval.log_dir={tmp_path}"], print_table=False)
    with pytest.raises(ConfigError, match="one agent"):
        run_eval("eval", [f"model.checkpoint={game_run}", "model.opponent=base", "env.options.opponent=random",
                          *EVAL, f"eval.log_dir={tmp_path}"], print_table=False)


def test_seatings_move_every_other_agent_to_the_opponent():
    specs = {role: AgentSpec(agent=object(), policy="policy_0", train_sampling=None, val_sampling=None,
                             adapter=role) for role in ("a", "b", "c")}
    assert list(seatings(specs, opponent=False)) == [(None, specs)]
    passes = dict(seatings(specs, opponent=True))
    assert list(passes) == ["a", "b", "c"]
    for seat, seated in passes.items():
        assert {role: (s.policy, s.adapter) for role, s in seated.items()} == {
            role: ("policy_0" if role == seat else PREFIX + "policy_0", role) for role in specs}


def test_an_agent_a_server_plays_is_never_the_evaluated_seat_and_keeps_its_server():
    import dataclasses

    import pytest

    from pettingllms.core import ConfigError

    specs = {role: AgentSpec(agent=object(), policy="policy_0", train_sampling=None, val_sampling=None,
                             adapter=role) for role in ("a", "b")}
    specs["b"] = dataclasses.replace(specs["b"], policy="server:b", adapter=None)
    passes = dict(seatings(specs, opponent=True))
    assert list(passes) == ["a"]  # no pass where the server's seat would be reported as the evaluated one
    assert passes["a"]["b"].policy == "server:b"
    with pytest.raises(ConfigError, match="no seat is left"):
        list(seatings({"b": specs["b"]} | {"c": dataclasses.replace(specs["b"], policy="server:c")}, opponent=True))
