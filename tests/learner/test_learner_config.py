import pytest

from pettingllms.learner.config import LearnerConfig
from settings_support import kl_penalty, learner_config


def test_total_steps_is_required_and_positive():
    with pytest.raises(TypeError, match="total_steps"):  # no defaults: the plan gives every field
        LearnerConfig()
    for bad in (0, -3, 2.5, True):
        with pytest.raises(ValueError, match="total_steps"):
            learner_config(total_steps=bad)
    assert learner_config(total_steps=10).total_steps == 10


@pytest.mark.parametrize(
    "field, value",
    [
        ("lr", 0.0),
        ("weight_decay", -0.1),
        ("betas", (0.9, 1.0)),
        ("eps", 0.0),
        ("warmup_steps", 11),
        ("min_lr_ratio", 1.5),
        ("grad_clip", 0.0),
        ("ppo_epochs", 0),
        ("ppo_mini_batch_size", -1),
        ("micro_batch_max_tokens", 0),
        ("clip_ratio_low", 1.0),
        ("clip_ratio_high", 0.0),
        ("clip_ratio_c", 1.0),
        ("loss_agg_mode", "seq-mean-token-sum-norm"),
        ("loss_agg_mode", "mean"),
        ("entropy_coeff", -0.01),
        ("dtype", "float16"),
    ],
)
def test_bad_values_name_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        learner_config(total_steps=10, **{field: value})


def test_kl_config_takes_one_name_per_setting():
    kl = kl_penalty(coef=0.05, target=0.02, horizon=500, adaptive=True)
    assert (kl.coef, kl.target, kl.horizon, kl.enabled) == (0.05, 0.02, 500, True)
    assert not kl_penalty().enabled
    # verl's names are the run config's (algorithm.kl.*), mapped once by the plan; the learner takes no aliases.
    with pytest.raises(TypeError, match="init_kl_coeff"):
        kl_penalty(coef=0.1, init_kl_coeff=0.2)
    with pytest.raises(ValueError, match="kl.type"):
        kl_penalty(type="k9")
    with pytest.raises(ValueError, match="kl.coef"):
        kl_penalty(coef=-1.0)
    with pytest.raises(ValueError, match="kl.target"):
        kl_penalty(coef=0.1, adaptive=True, target=0.0)


def test_the_run_config_reaches_the_learner_config_and_unknown_keys_are_refused():
    """What ``LearnerConfig.from_dict`` did for tests, the real path does for runs: the config's verl-named KL keys
    (algorithm.kl.*) and the optimiser keys become the policy's LearnerConfig; a misspelt key fails as it is read."""
    from pettingllms.assembly.plan import plan
    from pettingllms.core.errors import ConfigError
    from pettingllms.entry.train import load_config

    base = ["base_models.policy_0.path=tiny-random-smollm2", "env.name=toy_targets", "specialization=L1"]
    nested = learner_config(total_steps=5, lr=1e-5, kl=kl_penalty(coef=0.1, type="k3"))
    assert nested.kl.coef == 0.1 and nested.kl.type == "k3" and nested.lr == 1e-5
    (spec,) = plan(load_config("train", [*base, "training.total_training_steps=5", "algorithm.kl.init_kl_coeff=0.2",
                                         "algorithm.kl.kl_target=0.05", "algorithm.kl.kl_horizon=100",
                                         "algorithm.kl.adaptive=true", "optim.lr=1e-5"])).worker_specs
    flat = spec.learner
    assert (flat.kl.coef, flat.kl.target, flat.kl.horizon, flat.kl.adaptive) == (0.2, 0.05, 100, True)
    assert flat.total_steps == 5 and flat.lr == 1e-5
    with pytest.raises(ConfigError, match="unknown config key 'optim.lr_typo'"):
        load_config("train", [*base, "optim.lr_typo=1"])
    with pytest.raises(TypeError, match="lr_typo"):
        learner_config(total_steps=5, lr_typo=1)


def test_adamw_takes_the_fused_cuda_kernel_only_when_every_parameter_is_on_a_gpu():
    import torch

    from pettingllms.learner.learner import adamw_kernel

    class OnGpu:
        is_cuda = True

    assert adamw_kernel([OnGpu(), OnGpu()]) == {"fused": True}
    assert adamw_kernel([OnGpu(), torch.zeros(1)]) == {}  # a CPU-offloaded shard: torch's default
    assert adamw_kernel([torch.zeros(1)]) == {} and adamw_kernel([]) == {}
    optimizer = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(2))], **adamw_kernel([torch.zeros(1)]))
    assert not optimizer.defaults["fused"]
