"""Chunked divergences between a student's and a teacher's next-token distributions, computed from the two models'
hidden states and output layers without either model's `[N, V]` logits.

For each scored position n (the caller passes only those rows: compact), with `z = post(h @ W.T + b) / T`
(`post`: the model's logit scale and softcap; T: the temperature), `p = softmax(z)`:

    beta = 0            forward KL   KL(p_t || p_s) = sum_v p_t (log p_t - log p_s)
    beta = 1            reverse KL   KL(p_s || p_t) = sum_v p_s (log p_s - log p_t)
    0 < beta < 1        generalized JSD  beta KL(p_t || m) + (1 - beta) KL(p_s || m),  m = (1 - beta) p_s + beta p_t

which is what TRL 1.16's `GKDTrainer.generalized_jsd_loss` (also GOLD's) computes per token before masking and
reduction, and what `trl.kernels.chunked_divergence.ChunkedDivergenceFunction` computes for DistillationTrainer.
The gradient reaches the student only (the teacher's hidden states and head are constants).

Shape (the Liger-Kernel pattern): `ChunkedDivergenceFunction` owns the loop over row chunks, each over the FULL
vocabulary (as slimrl.ops.lean_logprob: no online-logsumexp rescaling), the projections into reused fp32 tiles,
the transforms, the in-place log-softmax and, in backward, the recompute and the accumulation of the hidden /
weight / bias gradients; a `Divergence` (slimrl.ops.divergences) only says, on one chunk of log-probabilities, what
the per-token value is and what its gradient with respect to the student's (transformed) logits is. Each step is in
place on the tiles or writes into a scratch tile (`out=`).

The teacher's head may be any module (a LoRA-wrapped or 4-bit quantized `lm_head`) and may sit on another device:
a weight on the student's device is projected like the student's; a weight elsewhere is projected there and each
chunk copied into the fp32 tile on the student's device; any other head is called on the chunk's rows (no gradient)
and its output copied into that tile.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from .chunking import AUTO_CHUNKS, chunk_bounds, resolve_num_chunks
from .divergences import divergence_for
from .lean_logprob import (
    ChunkProjector,
    accumulate_grads,
    chain_transform_,
    grads_out,
    rowdot,
    transform_keeping_tanh_,
    transform_logits_,
)


class HeadTransform(NamedTuple):
    """A model's logit post-processing: `softcap * tanh(z * logit_scale / softcap)` (softcap None: `z * scale`)."""

    logit_scale: float = 1.0
    softcap: float | None = None


PLAIN = HeadTransform()  # no scale, no softcap


class TeacherHead(NamedTuple):
    """The teacher's output layer: a weight [V, H_t] and bias (`module` None), or any module called on the rows."""

    weight: torch.Tensor | None
    bias: torch.Tensor | None = None
    module: torch.nn.Module | None = None
    transform: HeadTransform = PLAIN

    @classmethod
    def of(cls, module: torch.nn.Module, transform: HeadTransform = PLAIN) -> TeacherHead:
        """A plain `nn.Linear` by its weight and bias, any other head (LoRA-wrapped, quantized) as a module."""
        if type(module) is torch.nn.Linear:
            return cls(module.weight, module.bias, None, transform)
        return cls(None, None, module, transform)


class _ModuleProjector:
    """`module(hidden[start:end])` (no gradient) copied as fp32 into one reused tile on `device`."""

    def __init__(self, hidden, module, bounds, device, vocab):
        self.hidden, self.module = hidden, module
        rows = max([end - start for start, end in bounds], default=1)
        self.buf = torch.empty((rows, vocab), device=device, dtype=torch.float32)
        self.module_device = next(module.parameters()).device

    @torch.no_grad()
    def project(self, start: int, end: int) -> torch.Tensor:
        out = self.buf[: end - start]
        out.copy_(self.module(self.hidden[start:end].to(self.module_device)))
        return out


class _CopyingProjector(ChunkProjector):
    """A teacher weight on another device: each chunk projected there, copied into the tile on `device`."""

    def __init__(self, hidden, weight, bias, bounds, device):
        super().__init__(hidden.to(weight.device), weight, bias, bounds)
        self.tile = torch.empty(self.buf.shape, device=device, dtype=torch.float32)

    def project(self, start: int, end: int) -> torch.Tensor:
        return self.tile[: end - start].copy_(super().project(start, end))


def _teacher_projector(hidden, head: TeacherHead, bounds, device, vocab):
    hidden = hidden.detach()
    if head.module is not None:
        return _ModuleProjector(hidden, head.module, bounds, device, vocab)
    weight = head.weight.detach()
    bias = None if head.bias is None else head.bias.detach()
    if weight.device != device:
        return _CopyingProjector(hidden, weight, bias, bounds, device)
    return ChunkProjector(hidden.to(device), weight, bias, bounds)


def _log_softmax_(z, scratch) -> torch.Tensor:
    """In place: z [n, V] -> log_softmax(z) = z - max - log(sum exp(z - max)); returns `shifts` [n, 2], the max and the
    log-sum, for `_subtract_shifts_` (`scratch` holds exp(z - max) meanwhile)."""
    m = z.amax(1)
    z.sub_(m.unsqueeze(1))
    lse = torch.exp(z, out=scratch[: z.shape[0]]).sum(1).log_()
    z.sub_(lse.unsqueeze(1))
    return torch.stack((m, lse), 1)


def _subtract_shifts_(z, shifts) -> torch.Tensor:
    """The backward's recompute of `_log_softmax_`'s output, bit for bit: the two subtractions in the forward's order.
    (One subtraction of their rounded sum, log Z, would move each row's log-probs by up to u |log Z|: a per-row scale
    of p = exp(log p) that the gradient's differences, such as reverse KL's log p_s - log p_t - KL, amplify.)"""
    return z.sub_(shifts[:, :1]).sub_(shifts[:, 1:])


class ChunkedDivergenceFunction(torch.autograd.Function):
    """`(per_token [N], entropy [N] or None)`: the divergence of each row and the student's entropy (no gradient).

    Inputs: the student's hidden rows [N, H_s], its head weight [V, H_s] and bias, the teacher's hidden rows
    [N, H_t] and `TeacherHead`, a `Divergence`, the temperature, the student's `HeadTransform`, the number of row
    chunks (>= 1) and whether to return the entropy.
    """

    last_chunks = 0  # row chunks of the last forward: lets tests check that the knob acts

    @staticmethod
    def forward(
        ctx, s_hidden, s_weight, s_bias, t_hidden, teacher, divergence, temperature, s_transform, chunks, with_entropy
    ):
        ctx.set_materialize_grads(False)
        N, V = s_hidden.shape[0], s_weight.shape[0]
        bounds = chunk_bounds(N, int(chunks))
        s_proj = ChunkProjector(s_hidden, s_weight, s_bias, bounds)
        t_proj = _teacher_projector(t_hidden, teacher, bounds, s_hidden.device, V)
        scratch = [torch.empty_like(s_proj.buf) for _ in range(divergence.scratch_tiles)]
        f32 = dict(device=s_hidden.device, dtype=torch.float32)
        value = torch.empty(N, **f32)
        shifts_s, shifts_t = torch.empty(N, 2, **f32), torch.empty(N, 2, **f32)
        entropy = torch.empty(N, **f32) if with_entropy else None
        inv_t = 1.0 / temperature
        with torch.autocast(s_hidden.device.type, enabled=False):
            for start, end in bounds:
                rows = slice(start, end)
                s = transform_logits_(s_proj.project(start, end), *s_transform, inv_t)
                t = transform_logits_(t_proj.project(start, end), *teacher.transform, inv_t)
                shifts_s[rows] = _log_softmax_(s, scratch[0])
                shifts_t[rows] = _log_softmax_(t, scratch[0])
                if entropy is not None:  # H = -sum p log p
                    entropy[rows] = rowdot(torch.exp(s, out=scratch[0][: end - start]), s).neg_()
                value[rows] = divergence.forward_(s, t, [x[: end - start] for x in scratch])
        ChunkedDivergenceFunction.last_chunks = len(bounds)
        ctx.save_for_backward(s_hidden, s_weight, s_bias, t_hidden, shifts_s, shifts_t)
        ctx.setup = (bounds, s_proj.compute_dtype, teacher, divergence, inv_t, s_transform)
        if entropy is not None:
            ctx.mark_non_differentiable(entropy)
        return value, entropy

    @staticmethod
    def backward(ctx, grad_value, _grad_entropy):
        from trl.trainer.utils import maybe_gather_lm_head_ctx

        s_weight, s_bias = ctx.saved_tensors[1:3]
        with maybe_gather_lm_head_ctx(s_weight, s_bias):  # a ZeRO-3 head is gathered again, as TRL's kernels do
            return ChunkedDivergenceFunction._backward(ctx, grad_value)

    @staticmethod
    def _backward(ctx, grad_value):
        s_hidden, s_weight, s_bias, t_hidden, shifts_s, shifts_t = ctx.saved_tensors
        bounds, compute_dtype, teacher, divergence, inv_t, (scale, softcap) = ctx.setup
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        s_proj = ChunkProjector(s_hidden, s_weight, s_bias, bounds, compute_dtype)
        f32 = dict(device=s_hidden.device, dtype=torch.float32)
        grad_hidden = torch.zeros(s_hidden.shape, device=s_hidden.device, dtype=compute_dtype) if need_h else None
        grad_weight = torch.zeros(s_weight.shape, **f32) if need_w else None
        grad_bias = torch.zeros(s_weight.shape[0], **f32) if need_b else None
        if grad_value is None or not bounds or not (need_h or need_w or need_b):
            return (*grads_out(grad_hidden, grad_weight, grad_bias, s_hidden, s_weight, s_bias)[:3],) + (None,) * 7
        t_proj = _teacher_projector(t_hidden, teacher, bounds, s_hidden.device, s_weight.shape[0])
        scratch = [torch.empty_like(s_proj.buf) for _ in range(divergence.scratch_tiles)]
        tanh_buf = torch.empty_like(s_proj.buf) if softcap is not None else None
        g = grad_value.float()
        with torch.autocast(s_hidden.device.type, enabled=False):
            for start, end in bounds:
                n = end - start
                s = s_proj.project(start, end)
                tanh = transform_keeping_tanh_(s, scale, softcap, inv_t, tanh_buf)
                _subtract_shifts_(s, shifts_s[start:end])
                t = transform_logits_(t_proj.project(start, end), *teacher.transform, inv_t)
                _subtract_shifts_(t, shifts_t[start:end])
                divergence.backward_(s, t, [x[:n] for x in scratch])
                s.mul_(g[start:end].unsqueeze(1))
                chain_transform_(s, scale, softcap, inv_t, tanh)
                accumulate_grads(s, s_proj, start, end, grad_hidden, grad_weight, grad_bias)
        return (*grads_out(grad_hidden, grad_weight, grad_bias, s_hidden, s_weight, s_bias)[:3],) + (None,) * 7


def chunked_divergence(
    student_hidden: torch.Tensor,
    student_weight: torch.Tensor,
    student_bias: torch.Tensor | None,
    teacher_hidden: torch.Tensor,
    teacher: TeacherHead,
    beta: float,
    temperature: float = 1.0,
    student_transform: HeadTransform = PLAIN,
    num_chunks: int = AUTO_CHUNKS,
    with_entropy: bool = False,
):
    """`(per_token [N] fp32 with gradient, entropy [N] or None)` for the scored rows `student_hidden` [N, H_s] and
    `teacher_hidden` [N, H_t] (row n of both = the same position). `num_chunks`: the knob (slimrl.ops.chunking)."""
    if student_hidden.shape[0] != teacher_hidden.shape[0]:
        raise ValueError(
            f"student and teacher rows differ: {student_hidden.shape[0]} vs {teacher_hidden.shape[0]} positions"
        )
    divergence = divergence_for(beta)
    N, V = student_hidden.shape[0], student_weight.shape[0]
    tiles = 3 + divergence.scratch_tiles + (student_transform.softcap is not None)  # s, t, teacher's own output
    chunks = resolve_num_chunks(N, V, num_chunks, buffers=tiles)
    return ChunkedDivergenceFunction.apply(
        student_hidden,
        student_weight,
        student_bias,
        teacher_hidden,
        teacher,
        divergence,
        float(temperature),
        student_transform,
        chunks,
        with_entropy,
    )
