"""The micro-batch objective against hand computations of the PPO-clip (dual clip) formula."""

import math

import pytest
import torch

from pettingllms.algo.losses import PPOLossSettings, micro_batch_objective
from pettingllms.algo.verl_adapter import GlobalBatchInfo

SETTINGS = PPOLossSettings(loss_agg_mode="token-mean", clip_ratio_low=0.2, clip_ratio_high=0.2, clip_ratio_c=3.0)


def _objective(log_probs, old, adv, mask, settings=SETTINGS, **kwargs):
    t = lambda rows: torch.tensor(rows, dtype=torch.float32)  # noqa: E731
    return micro_batch_objective(t(log_probs), t(old), t(adv), t(mask), settings, **kwargs)


def test_ratio_one_gives_minus_token_mean_advantage():
    adv = [[1.0, 1.0, 1.0], [-0.5, -0.5, 0.0]]
    mask = [[1, 1, 1], [1, 1, 0]]
    lp = [[-1.0, -2.0, -0.5], [-0.3, -0.7, 0.0]]
    loss, parts = _objective(lp, lp, adv, mask)
    expected = -(3 * 1.0 + 2 * -0.5) / 5
    assert loss.item() == pytest.approx(expected)
    assert parts.pg_clipfrac == 0.0 and parts.ppo_kl == 0.0 and parts.num_tokens == 5


def test_seq_mean_token_mean_weights_sequences_equally():
    adv = [[1.0, 1.0, 1.0], [-0.5, -0.5, 0.0]]
    mask = [[1, 1, 1], [1, 1, 0]]
    lp = [[-1.0, -2.0, -0.5], [-0.3, -0.7, 0.0]]
    settings = PPOLossSettings(loss_agg_mode="seq-mean-token-mean")
    loss, _ = _objective(lp, lp, adv, mask, settings)
    assert loss.item() == pytest.approx(-(1.0 + -0.5) / 2)


def test_clip_and_dual_clip_match_the_formula():
    # One token each: ratio = exp(logp - old).
    ratios = [1.5, 0.5, 5.0, 1.1]
    advs = [1.0, -1.0, -1.0, 2.0]
    old = [[0.0]] * 4
    lp = [[math.log(r)] for r in ratios]
    loss, parts = _objective(lp, old, [[a] for a in advs], [[1.0]] * 4)

    def hand(ratio, adv, eps=0.2, c=3.0):
        clipped = max(-adv * ratio, -adv * min(max(ratio, 1 - eps), 1 + eps))
        return min(clipped, -adv * c) if adv < 0 else clipped  # dual clip bounds the loss of negative advantages

    per_token = [hand(r, a) for r, a in zip(ratios, advs)]
    # ratio 1.5, A>0: clipped to 1.2. ratio 0.5, A<0: clipped to 0.8. ratio 5, A<0: dual clip caps at 3.
    assert per_token == pytest.approx([-1.2, 0.8, 3.0, -2.2])
    assert loss.item() == pytest.approx(sum(per_token) / 4)
    # Tokens 0 and 1 take the clipped term; token 2's unclipped term (5) wins the max and the dual clip caps it.
    assert parts.pg_clipfrac == pytest.approx(2 / 4)
    assert parts.pg_clipfrac_lower == pytest.approx(1 / 4)  # only the ratio-5 negative-advantage token


def test_dual_clip_gradient_is_zero_beyond_c():
    lp = torch.tensor([[math.log(5.0)]], requires_grad=True)
    loss, _ = micro_batch_objective(lp, torch.zeros(1, 1), -torch.ones(1, 1), torch.ones(1, 1), SETTINGS)
    loss.backward()
    assert lp.grad.item() == 0.0


def test_kl_and_entropy_terms_are_added_with_their_coefficients():
    lp = [[-1.0, -2.0]]
    ref = [[-1.5, -1.0]]
    ent = [[2.0, 4.0]]
    mask = [[1.0, 1.0]]
    t = lambda rows: torch.tensor(rows)  # noqa: E731
    base, _ = _objective(lp, lp, [[0.0, 0.0]], mask)
    settings = PPOLossSettings(entropy_coeff=0.1, kl_type="k1")
    loss, parts = micro_batch_objective(
        t(lp), t(lp), t([[0.0, 0.0]]), t(mask), settings, ref_log_probs=t(ref), kl_coef=0.5, entropy=t(ent)
    )
    k1 = ((-1.0 + 1.5) + (-2.0 + 1.0)) / 2
    assert parts.kl_token_mean == pytest.approx(k1)
    assert parts.entropy_token_mean == pytest.approx(3.0)
    assert loss.item() == pytest.approx(base.item() + 0.5 * k1 - 0.1 * 3.0)


def test_global_batch_info_makes_micro_batch_losses_add_up():
    torch.manual_seed(0)
    lp, old, adv = torch.randn(6, 5), torch.randn(6, 5) * 0.1, torch.randn(6, 1).expand(6, 5)
    mask = (torch.rand(6, 5) > 0.3).float()
    mask[:, 0] = 1.0
    for mode in ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "token-sum"):
        settings = PPOLossSettings(loss_agg_mode=mode)
        whole, _ = micro_batch_objective(lp, lp + old, adv, mask, settings)
        info = GlobalBatchInfo(batch_num_tokens=int(mask.sum()), global_batch_size=6)
        parts = [
            micro_batch_objective(lp[s], (lp + old)[s], adv[s], mask[s], settings, info)[0]
            for s in (slice(0, 2), slice(2, 5), slice(5, 6))
        ]
        assert sum(parts).item() == pytest.approx(whole.item(), rel=1e-5), mode
