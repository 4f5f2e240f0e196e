"""An agent played by a model behind an OpenAI-compatible server (``agents.<role>.server.url``) while the others
train: the real HTTP client against a real ``/v1/completions`` server (tests/eval/completions_server.py over the
tiny model), in training and in ``pettingllms eval``; refusals before anything loads."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from pettingllms.core import ConfigError, InfrastructureError
from pettingllms.entry.train import run_training

TESTS = Path(__file__).resolve().parents[1]
TRAIN = ["base_models.policy_0.path=tiny-random-smollm2", "env.name=lenient_nim:LenientNim", "specialization=L2",
         "training.total_training_steps=2", "training.train_batch_size=2", "rollout.branching=2",
         "training.max_response_length=3", "training.val_freq=2", "training.val_before_train=false",
         "training.export_hf=false", "training.plot=false", "resources.use_ray=false", "env.max_val_problems=2",
         "training.save_samples_freq=1", "+agents.player_1.trainable=false"]


@pytest.fixture
def server(monkeypatch):
    monkeypatch.syspath_prepend(str(TESTS))  # lenient_nim
    monkeypatch.syspath_prepend(str(TESTS / "eval"))  # completions_server
    from completions_server import CompletionsServer

    from pettingllms.models import HFChatCodec, load_model, resolve_model
    from pettingllms.rollout.hf_engine import HFEngine

    path = resolve_model("tiny-random-smollm2")
    codec = HFChatCodec.from_pretrained(path)
    with CompletionsServer(HFEngine(load_model(path), codec, seed=1), codec.tokenizer, name="rival") as served:
        yield served
    sys.modules.pop("completions_server", None)


def test_a_served_agent_plays_every_move_of_its_seat_and_only_the_other_seat_trains(server, tmp_path, capsys):
    trainer, _ = run_training("train", [*TRAIN, f"+agents.player_1.server.url={server.url}",
                                        "+agents.player_1.server.model=rival", f"training.log_dir={tmp_path}"])
    train_log = (trainer.run_dir / "train.log").read_text()
    assert f"agent:    player_1 -> the server {server.url} (model rival; prompts in policy_0's chat template)" \
        in train_log
    moves = [b for b in server.bodies if b["model"] == "rival"]
    assert moves and all(isinstance(b["prompt"], list) for b in moves)  # the prompt's token ids
    # player_1's moves: branched K=2 in training (as any frozen agent), one per validation episode, at T=0 there
    assert {b["n"] for b in moves} == {1, 2} and any(b["temperature"] == 0.0 for b in moves)
    for step in (1, 2):  # nothing of the served seat reaches a policy's samples
        lines = (trainer.run_dir / "samples" / f"step_{step:06d}.jsonl").read_text().splitlines()
        assert lines and {json.loads(line)["agent"] for line in lines} == {"player_0"}
    rows = [json.loads(line) for line in (trainer.run_dir / "summary.log").read_text().splitlines()]
    assert "episode/player_1/win_rate" in rows[-1] and "val/procedural/player_1/win_rate" in rows[-1]

    # evaluation of that run keeps the server on player_1 (the run's config is data: its agents come along)
    from pettingllms.entry.eval import run_eval

    before = len(server.bodies)
    result = run_eval("eval", [f"model.checkpoint={trainer.run_dir}", "env.name=lenient_nim:LenientNim", "eval.n=1",
                               "eval.max_tokens=3", "env.max_val_problems=2", f"eval.log_dir={tmp_path / 'eval'}"],
                      print_table=False)
    assert len(server.bodies) > before
    assert result.summary["model"]["policies"]["server:player_1"]["server_url"] == server.url


def test_a_trainable_served_agent_a_bad_url_and_a_wrong_model_name_are_refused(server, tmp_path):
    with pytest.raises(ConfigError, match=r"set agents.player_1.trainable=false"):
        run_training("train", [*TRAIN[:-1], f"+agents.player_1.server.url={server.url}",
                               f"training.log_dir={tmp_path}"])
    with pytest.raises(ConfigError, match=r"\['policy_player_1'\] would serve only agents that a server plays"):
        run_training("train", [*TRAIN, "specialization=L3", f"+agents.player_1.server.url={server.url}",
                               f"training.log_dir={tmp_path}"])
    with pytest.raises(ConfigError, match=r"http\(s\) API root"):
        run_training("train", [*TRAIN, "+agents.player_1.server.url=localhost:8000", f"training.log_dir={tmp_path}"])
    with pytest.raises((ConfigError, InfrastructureError), match="nosuch"):
        run_training("train", [*TRAIN, f"+agents.player_1.server.url={server.url}",
                               "+agents.player_1.server.model=nosuch", f"training.log_dir={tmp_path}"])


def test_the_pages_served_agent_command_plans_with_the_server_named(monkeypatch):
    """docs/self_play.md's served-agent command, as written (the tiny model in place of the default one); planning
    contacts no server."""
    import re
    import shlex

    pytest.importorskip("pyspiel", reason="the games extra: pip install -e '.[games]'")
    from pettingllms.assembly.describe import describe_plan
    from pettingllms.assembly.plan import plan
    from pettingllms.entry.train import load_config

    page = (TESTS.parent / "docs" / "self_play.md").read_text()
    (command,) = [c for c in re.findall(r"```bash\n(.*?)```", page, flags=re.S) if "server.url" in c]
    words = shlex.split(command.replace("\\\n", " "))
    assert words[:2] == ["pettingllms", "train"]
    described = describe_plan(plan(load_config("train", [*words[2:], "base_models.policy_0.path=tiny-random-smollm2"])))
    assert ("agent:    player_1 -> the server http://localhost:8000/v1 (model Qwen/Qwen3-1.7B; prompts in policy_0's "
            "chat template), frozen") in described
