"""Config choices behave as their strings everywhere a string went before (comparison, hashing, formatting, JSON,
pickling for Ray), and the schema types every choice with them."""

from __future__ import annotations

import dataclasses
import json
import pickle

import pytest

from pettingllms.core.choices import Choice, KLType, LossAggMode, RolloutMode, Specialization


@pytest.mark.parametrize("member, text", [
    (RolloutMode.trajectory, "trajectory"), (Specialization.L2, "L2"), (LossAggMode["seq-mean-token-sum"],
                                                                      "seq-mean-token-sum"), (KLType["k3+"], "k3+"),
])
def test_a_choice_is_its_string(member, text):
    assert member == text and text == member and hash(member) == hash(text)
    assert (str(member), f"{member}", f"{member:>20}", "%s" % member) == (text, text, f"{text:>20}", text)
    assert json.dumps({member: [member]}) == json.dumps({text: [text]})
    assert pickle.loads(pickle.dumps(member)) is member
    assert {text: 1}[member] == 1 and member in (text,)


def test_every_member_name_is_its_value_as_omegaconf_converts_by_name():
    for choice in Choice.__subclasses__():
        assert all(name == member.value for name, member in choice.__members__.items()), choice
    assert LossAggMode.values() == ("token-mean", "token-sum", "seq-mean-token-mean", "seq-mean-token-sum")


def test_the_schema_types_every_choice():
    from pettingllms.config import schema

    typed = {f"{cls.__name__}.{field.name}": field.type for cls in vars(schema).values()
             if dataclasses.is_dataclass(cls) for field in dataclasses.fields(cls)}
    assert typed["RolloutConfig.mode"] == "RolloutMode" and typed["RolloutConfig.select"] == "Selection"
    assert typed["ModelConfig.dtype"] == typed["ModelConfig.master_weights"] == "DType"
    assert typed["ModelConfig.engine"] == "EngineKind" and typed["Config.specialization"] == "Specialization"
    assert typed["AlgorithmConfig.filter"] == "GroupFilter" and typed["AlgorithmConfig.loss_agg_mode"] == "LossAggMode"
    assert typed["KLConfig.kl_type"] == "KLType" and typed["TrainingConfig.logger"] == "List[Tracker]"
    assert typed["EvalModelConfig.prompt_format"] == "PromptFormat"
