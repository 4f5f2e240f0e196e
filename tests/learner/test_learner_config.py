import pytest

from pettingllms.learner.config import KLPenalty, LearnerConfig


def test_total_steps_is_required_and_positive():
    with pytest.raises(ValueError, match="total_steps is required"):
        LearnerConfig()
    for bad in (0, -3, 2.5, True):
        with pytest.raises(ValueError, match="total_steps"):
            LearnerConfig(total_steps=bad)
    assert LearnerConfig(total_steps=10).total_steps == 10


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
        LearnerConfig(total_steps=10, **{field: value})


def test_kl_config_accepts_verl_names_and_rejects_conflicts():
    kl = KLPenalty(init_kl_coeff=0.05, kl_target=0.02, kl_horizon=500, adaptive=True)
    assert (kl.coef, kl.target, kl.horizon, kl.enabled) == (0.05, 0.02, 500, True)
    assert not KLPenalty().enabled
    with pytest.raises(ValueError, match="conflicts"):
        KLPenalty(coef=0.1, init_kl_coeff=0.2)
    with pytest.raises(ValueError, match="kl.type"):
        KLPenalty(type="k9")
    with pytest.raises(ValueError, match="kl.coef"):
        KLPenalty(coef=-1.0)
    with pytest.raises(ValueError, match="kl.target"):
        KLPenalty(coef=0.1, adaptive=True, target=0.0)


def test_from_dict_accepts_nested_and_flat_kl_and_rejects_unknown_keys():
    nested = LearnerConfig.from_dict({"total_steps": 5, "lr": 1e-5, "kl": {"coef": 0.1, "type": "k3"}})
    assert nested.kl.coef == 0.1 and nested.kl.type == "k3" and nested.lr == 1e-5
    flat = LearnerConfig.from_dict(
        {"total_steps": 5, "init_kl_coeff": 0.2, "kl_target": 0.05, "kl_horizon": 100, "adaptive_kl": True}
    )
    assert (flat.kl.coef, flat.kl.target, flat.kl.horizon, flat.kl.adaptive) == (0.2, 0.05, 100, True)
    assert LearnerConfig(total_steps=3, kl={"coef": 0.3}).kl.coef == 0.3
    with pytest.raises(ValueError, match="unknown learner config keys.*'lr_typo'"):
        LearnerConfig.from_dict({"total_steps": 5, "lr_typo": 1})
