"""PPO's math as small pure functions on tensors: masked statistics, KL estimators, per-token rewards, GAE, losses.

Shapes: `[B, C]` per response token (C = the longest response in the batch), `mask` is 1 on real response tokens
(the stop token included) and 0 on padding; `scores` is `[B]`. Nothing here knows about models or trainers, so
each function can be tested against a hand computation, and the losses can move to a shared "the base owns the
chunk loop, each loss writes only its math" module later.

Choices (each differs from TRL's old `PPOTrainer` only where its masks needed a workaround):
1. One mask for log-probs, values and rewards: it includes the stop token, so the score sits on the last real token.
   TRL treated an EOS equal to the pad token as padding and extended the value/reward mask one position past it
   (`padding_mask_p1`); with an explicit mask that workaround is not needed.
2. Statistics (`approxkl`, `ratio`, `entropy`) are masked means over real tokens; TRL averaged `approxkl` and the
   ratio over padding too (where it had set both log-probs to 1, so ratio 1, diff 0), which diluted them.
3. Formulas otherwise as TRL's PPO: k1 = logp - ref, k3 = (exp(ref - logp) - 1) - (ref - logp); the penalty
   `-kl_coef * kl` per token; GAE with `gamma`, `lam`; advantages whitened over the mask; the clipped policy loss
   `max(-A r, -A clip(r, 1-eps, 1+eps))` and the clipped value loss
   `0.5 max((v - R)^2, (clip(v, v_old +- eps_v) - R)^2)`, each a masked mean over the micro-batch.
"""

from __future__ import annotations

import torch

KL_ESTIMATORS = ("k1", "k3")


def masked_mean(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean of `values` where `mask` is 1 (over `dim`, or everything); an empty mask gives 0, not NaN."""
    mask = mask.to(values.dtype)
    if dim is None:
        return (values * mask).sum() / mask.sum().clamp(min=1)
    return (values * mask).sum(dim) / mask.sum(dim).clamp(min=1)


def masked_var(values: torch.Tensor, mask: torch.Tensor, unbiased: bool = True) -> torch.Tensor:
    """Variance of the masked entries (Bessel-corrected unless `unbiased=False`); fewer than 2 entries raise."""
    count = mask.sum()
    if unbiased and count < 2:
        raise ValueError(f"masked variance needs at least 2 response tokens, got {int(count)}: use a larger batch.")
    centered = values - masked_mean(values, mask)
    variance = masked_mean(centered**2, mask)
    return variance * (count / (count - 1)) if unbiased else variance


def masked_whiten(values: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True) -> torch.Tensor:
    """(values - mean) / std over the masked entries, zero elsewhere; `shift_mean=False` keeps the mean."""
    mean, var = masked_mean(values, mask), masked_var(values, mask)
    whitened = (values - mean) * torch.rsqrt(var + 1e-8)
    if not shift_mean:
        whitened = whitened + mean
    return whitened * mask.to(values.dtype)


def kl_estimate(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, estimator: str) -> torch.Tensor:
    """Per-token KL(policy || reference) estimate from sampled tokens (http://joschu.net/blog/kl-approx.html)."""
    log_ratio = ref_logprobs - logprobs
    if estimator == "k1":
        return -log_ratio
    if estimator == "k3":
        return torch.expm1(log_ratio) - log_ratio
    raise ValueError(f"kl_estimator must be one of {KL_ESTIMATORS}, got {estimator!r}")


def last_token_index(mask: torch.Tensor) -> torch.Tensor:
    """Index of the last real token of each row (0 for an empty row)."""
    return (mask.long().sum(1) - 1).clamp(min=0)


def token_rewards(kl: torch.Tensor, scores: torch.Tensor, mask: torch.Tensor, kl_coef: float):
    """(rewards, non_score_reward): `-kl_coef * kl` on every real token, plus the score on each row's last token."""
    non_score_reward = -kl_coef * kl * mask.to(kl.dtype)
    rewards = non_score_reward.clone()
    rows = torch.arange(rewards.shape[0], device=rewards.device)
    rewards[rows, last_token_index(mask)] += scores.to(rewards.dtype)
    return rewards, non_score_reward


def gae(rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float, lam: float):
    """(advantages, returns) by generalized advantage estimation; the value after the last real token is 0."""
    mask = mask.to(values.dtype)
    rewards, values = rewards * mask, values * mask
    advantages = torch.zeros_like(values)
    last = torch.zeros_like(values[:, 0])
    length = values.shape[1]
    for t in reversed(range(length)):
        next_value = values[:, t + 1] if t + 1 < length else torch.zeros_like(last)
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        last = delta + gamma * lam * last
        advantages[:, t] = last
    return advantages * mask, (advantages + values) * mask


def policy_loss(
    new_logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    cliprange: float,
):
    """PPO's clipped surrogate: (loss, stats) with stats `clipfrac`, `approxkl`, `ratio` (masked means, no grad)."""
    log_ratio = new_logprobs - old_logprobs
    ratio = torch.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - cliprange, 1.0 + cliprange)
    loss = masked_mean(torch.max(unclipped, clipped), mask)
    with torch.no_grad():
        stats = {
            "clipfrac": masked_mean((clipped > unclipped).float(), mask),
            "approxkl": 0.5 * masked_mean(log_ratio**2, mask),
            "ratio": masked_mean(ratio, mask),
        }
    return loss, stats


def value_loss(
    values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor, cliprange_value: float
):
    """PPO's clipped value loss: (loss, clipfrac). Predictions may move at most `cliprange_value` from the
    rollout's values before the clipped branch takes over (the larger of the two squared errors counts)."""
    clipped_values = torch.clamp(values, old_values - cliprange_value, old_values + cliprange_value)
    unclipped_error = (values - returns) ** 2
    clipped_error = (clipped_values - returns) ** 2
    loss = 0.5 * masked_mean(torch.max(unclipped_error, clipped_error), mask)
    with torch.no_grad():
        clipfrac = masked_mean((clipped_error > unclipped_error).float(), mask)
    return loss, clipfrac
