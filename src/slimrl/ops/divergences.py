"""The divergences slimrl.ops.chunked_divergence computes, each as its math on one chunk of log-probabilities (the
Liger-Kernel pattern: the chunk loop, the projections and the recompute are the caller's).

Choices:
1. Differences such as `log p_t - log p_s` are formed element-wise before the weighted sum (as stock's `F.kl_div`
   does), never as a difference of two sums, which would cancel when student and teacher agree.
2. The forward's row sums are `bmm` row dot products (no product tile); the backward's, a KL subtracted from every
   entry of its row, go through a scratch tile and torch's cascade sum (`_row_sums`, below).
3. TRL's choice by `beta`: 0 forward KL, 1 reverse KL, otherwise the generalized JSD (`divergence_for`).
"""

from __future__ import annotations

import math

import torch

from .lean_logprob import rowdot


class Divergence:
    """The math of one loss on one chunk of log-probabilities `s` (student) and `t` (teacher), both `[n, V]` fp32.

    `forward_` returns each row's value [n]; `backward_` leaves in `s` the gradient of each row's value with respect
    to the student's transformed logits.
    Both may overwrite `s`, `t` and the `scratch` tiles (`scratch_tiles` of them, same shape).
    """

    scratch_tiles = 1

    def forward_(self, s, t, scratch):
        raise NotImplementedError

    def backward_(self, s, t, scratch):
        raise NotImplementedError


def _row_sums(a, b, tile):
    """sum(a * b, -1) per row, [n, 1], through the scratch `tile`. The backward's row sums (a KL subtracted from every
    entry of its row) are small sums of terms of both signs; torch's cascade summation lands them closer to float64
    than a `bmm` dot product's running sum, which left the reverse-KL and JSD gradients 1.4-1.6x further from float64
    than stock's (tests/ops/test_ops_chunked_divergence.py, `test_gradient_error_near_stock`)."""
    return torch.mul(a, b, out=tile).sum(1, keepdim=True)


class ForwardKL(Divergence):
    """beta = 0: KL(p_t || p_s); d/dz_s = p_s - p_t."""

    def forward_(self, s, t, scratch):
        torch.sub(t, s, out=s)  # log p_t - log p_s
        return rowdot(t.exp_(), s)

    def backward_(self, s, t, scratch):
        s.exp_().sub_(t.exp_())


class ReverseKL(Divergence):
    """beta = 1: KL(p_s || p_t); d/dz_s = p_s (log p_s - log p_t - KL)."""

    def forward_(self, s, t, scratch):
        torch.sub(s, t, out=t)  # log p_s - log p_t
        return rowdot(s.exp_(), t)

    def backward_(self, s, t, scratch):
        x = torch.sub(s, t, out=t)  # log p_s - log p_t
        s.exp_()
        s.mul_(x.sub_(_row_sums(s, x, scratch[0])))


class GeneralizedJSD(Divergence):
    """0 < beta < 1: beta KL(p_t || m) + (1 - beta) KL(p_s || m);
    d/dz_s = (1 - beta) p_s (log p_s - log m - KL(p_s || m))."""

    scratch_tiles = 2

    def __init__(self, beta: float):
        self.beta = float(beta)
        self.log_student_weight = math.log1p(-self.beta)  # log(1 - beta), as stock's torch.log1p(-beta)
        self.log_teacher_weight = math.log(self.beta)

    def _log_mixture(self, s, t, out, tmp):
        """out <- log((1 - beta) p_s + beta p_t); `out` may be `t`."""
        torch.add(s, self.log_student_weight, out=tmp)
        torch.add(t, self.log_teacher_weight, out=out)
        torch.logaddexp(tmp, out, out=out)

    def forward_(self, s, t, scratch):
        log_m, diff = scratch[0], scratch[1]
        self._log_mixture(s, t, log_m, diff)
        torch.sub(s, log_m, out=diff)
        kl_student = rowdot(s.exp_(), diff)
        torch.sub(t, log_m, out=diff)
        kl_teacher = rowdot(t.exp_(), diff)
        return self.beta * kl_teacher + (1 - self.beta) * kl_student

    def backward_(self, s, t, scratch):
        self._log_mixture(s, t, t, scratch[0])  # t <- log m
        x = torch.sub(s, t, out=t)  # log p_s - log m
        s.exp_()
        s.mul_(x.sub_(_row_sums(s, x, scratch[0]))).mul_(1 - self.beta)


def divergence_for(beta: float) -> Divergence:
    """TRL's choice by `beta`: 0 -> forward KL, 1 -> reverse KL, otherwise the generalized JSD."""
    if not 0.0 <= beta <= 1.0:
        raise ValueError(f"beta must be in [0.0, 1.0], got {beta}.")
    if beta == 0:
        return ForwardKL()
    if beta == 1:
        return ReverseKL()
    return GeneralizedJSD(beta)
