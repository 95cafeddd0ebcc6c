"""PPO's math (slimrl.ppo.core) against hand computations and direct formulas; each check has a negative control
(the same comparison with a 0.1% error in the expected value must fail)."""

import math

import pytest
import torch

from slimrl.ppo import core


def assert_matches(actual, expected, rtol=1e-6, atol=1e-7):
    """Equal within float tolerance, and a 0.1% error in `expected` is detected (the comparison can fail)."""
    expected = torch.as_tensor(expected, dtype=torch.float64)
    actual = torch.as_tensor(actual, dtype=torch.float64)
    torch.testing.assert_close(actual, expected, rtol=rtol, atol=atol)
    with pytest.raises(AssertionError):
        torch.testing.assert_close(actual, expected * 1.001 + 1e-6 * (expected == 0), rtol=rtol, atol=atol)


def test_gae_matches_a_hand_computed_example():
    # gamma 0.9, lam 0.8; row 0 has 3 real tokens, row 1 has 2 (its third column is padding with junk values)
    rewards = torch.tensor([[0.0, 0.5, 1.0], [0.3, 1.0, 9.0]], dtype=torch.float64)
    values = torch.tensor([[0.2, 0.4, 0.6], [0.5, 0.1, 7.0]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    advantages, returns = core.gae(rewards, values, mask, gamma=0.9, lam=0.8)
    # row 0: d2 = 1 - .6 = .4; d1 = .5 + .9*.6 - .4 = .64; d0 = .9*.4 - .2 = .16
    #        A2 = .4; A1 = .64 + .72*.4 = .928; A0 = .16 + .72*.928 = .82816
    # row 1: d1 = 1 + .9*0 - .1 = .9 (the value after the last token is 0); d0 = .3 + .9*.1 - .5 = -.11
    #        A1 = .9; A0 = -.11 + .72*.9 = .538; the padded column is 0
    assert_matches(advantages, [[0.82816, 0.928, 0.4], [0.538, 0.9, 0.0]])
    assert_matches(returns, [[1.02816, 1.328, 1.0], [1.038, 1.0, 0.0]])


def test_token_rewards_put_the_score_on_the_last_real_token():
    kl = torch.tensor([[0.1, 0.2, 0.3], [0.4, 0.5, 0.6]])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]])
    rewards, non_score = core.token_rewards(kl, torch.tensor([2.0, -1.0]), mask, kl_coef=0.5)
    assert_matches(non_score, [[-0.05, -0.1, -0.15], [-0.2, 0.0, 0.0]])
    assert_matches(rewards, [[-0.05, -0.1, 1.85], [-1.2, 0.0, 0.0]])


def test_masked_whiten_has_zero_mean_unit_variance_on_real_tokens_and_zero_elsewhere():
    values = torch.tensor([[1.0, 2.0, 3.0, 50.0], [4.0, 5.0, -7.0, 6.0]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 1]])
    white = core.masked_whiten(values, mask)
    real = white[mask.bool()]
    assert abs(real.mean().item()) < 1e-6 and abs(real.var().item() - 1.0) < 1e-4  # Bessel-corrected, as TRL's
    assert (white[~mask.bool()] == 0).all()
    expected = (torch.tensor([1.0, 2, 3, 4, 5, 6]) - 3.5) / torch.tensor([1.0, 2, 3, 4, 5, 6]).std()
    assert_matches(real, expected, rtol=1e-5)
    kept = core.masked_whiten(values, mask, shift_mean=False)[mask.bool()]
    assert_matches(kept.mean(), 3.5, rtol=1e-5)


def _direct_policy_loss(new, old, adv, mask, eps):
    terms = []
    for n, o, a, m in zip(
        new.flatten().tolist(), old.flatten().tolist(), adv.flatten().tolist(), mask.flatten().tolist()
    ):
        if m:
            r = math.exp(n - o)
            terms.append(max(-a * r, -a * min(max(r, 1 - eps), 1 + eps)))
    return sum(terms) / len(terms)


def test_clipped_policy_loss_equals_the_direct_formula_and_clipped_tokens_get_no_gradient():
    # ratios e^{0.5} (clipped for A > 0), e^{-0.5} (clipped for A < 0), e^{0.05} (inside), and a padded token
    old = torch.zeros(1, 4, dtype=torch.float64)
    new = torch.tensor([[0.5, -0.5, 0.05, 3.0]], dtype=torch.float64, requires_grad=True)
    adv = torch.tensor([[1.0, -2.0, 0.7, 5.0]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1, 0]])
    loss, stats = core.policy_loss(new, old, adv, mask, cliprange=0.2)
    assert_matches(loss.detach(), _direct_policy_loss(new.detach(), old, adv, mask, 0.2))
    assert_matches(stats["clipfrac"], 2 / 3)
    assert_matches(stats["approxkl"], 0.5 * (0.25 + 0.25 + 0.0025) / 3)
    loss.backward()
    assert new.grad[0, 0] == 0 and new.grad[0, 1] == 0 and new.grad[0, 3] == 0
    assert_matches(new.grad[0, 2], -0.7 * math.exp(0.05) / 3)  # d/dlogp of -A e^{logp - old}, mean over 3


def test_clipped_value_loss_equals_the_direct_formula():
    old_values = torch.tensor([[0.0, 1.0, 0.5]])
    values = torch.tensor([[0.5, 1.05, 2.0]], requires_grad=True)
    returns = torch.tensor([[1.0, 0.0, 9.0]])
    mask = torch.tensor([[1, 1, 0]])
    loss, clipfrac = core.value_loss(values, old_values, returns, mask, cliprange_value=0.2)
    # token 0: v=.5 clipped to .2: max((.5-1)^2, (.2-1)^2) = .64 (clipped wins); token 1: v=1.05 inside: (1.05)^2
    assert_matches(loss.detach(), 0.5 * (0.64 + 1.05**2) / 2)
    assert_matches(clipfrac, 0.5)
    loss.backward()
    assert values.grad[0, 0] == 0 and values.grad[0, 2] == 0
    assert_matches(values.grad[0, 1], 0.5 * 2 * 1.05 / 2)


def test_kl_estimators_are_the_known_formulas_and_estimate_the_true_kl():
    logp = torch.tensor([-1.0, -2.0])
    ref = torch.tensor([-1.5, -1.0])
    assert_matches(core.kl_estimate(logp, ref, "k1"), [0.5, -1.0])
    assert_matches(core.kl_estimate(logp, ref, "k3"), [math.exp(-0.5) - 1 + 0.5, math.exp(1.0) - 1 - 1.0])
    # sampled from p, both are unbiased estimates of KL(p || q); k3 is never negative
    generator = torch.Generator().manual_seed(0)
    p = torch.tensor([0.5, 0.3, 0.15, 0.05])
    q = torch.tensor([0.25, 0.25, 0.25, 0.25])
    samples = torch.multinomial(p, 200_000, replacement=True, generator=generator)
    true_kl = (p * (p / q).log()).sum()
    for estimator in ("k1", "k3"):
        estimate = core.kl_estimate(p.log()[samples], q.log()[samples], estimator)
        assert abs(estimate.mean() - true_kl) < 0.01, estimator
    assert (core.kl_estimate(p.log()[samples], q.log()[samples], "k3") >= 0).all()
    with pytest.raises(ValueError, match="k1.*k3"):
        core.kl_estimate(logp, ref, "k2")


def test_masked_statistics_ignore_padding_and_an_empty_mask_gives_zero():
    values = torch.tensor([[1.0, 3.0, 100.0]])
    assert core.masked_mean(values, torch.tensor([[1, 1, 0]])).item() == 2.0
    assert core.masked_mean(values, torch.zeros(1, 3)).item() == 0.0
    with pytest.raises(ValueError, match="at least 2"):
        core.masked_var(values, torch.tensor([[1, 0, 0]]))
