"""Memory-lean per-token log-probabilities of `hidden @ weight.T` (torch ops, any device).

Choices, and why they differ from TRL 1.16's `trl.kernels.chunked_logprob.ChunkedLogProbFunction` torch fallback:

1. Row chunks over the FULL vocabulary instead of `[4096, 32768]` online-logsumexp tiles. A row chunk of `n` tokens
   holds `n x V` fp32 logits; `n` comes from a byte budget or from the caller (slimrl.ops.chunking). Seeing the whole
   row at once makes the fold a plain max / exp / sum: no rescaling, no `max_before_target` tile mask (`argmax`
   gives the first maximum).
2. Every tile-sized operation is in place on one or two reused fp32 buffers (`ChunkProjector`): the projection writes
   into the buffer, scale / softcap / temperature are applied in place, `exp` goes to the second buffer only when
   entropy or `log_sum_sq_probs` needs the shifted logits too, and row dot products (`sum p*z`, `sum p^2`) use `bmm`
   so no product tile is allocated. TRL's eager fallback allocates 4-6 tile-sized temporaries per tile.
3. Backward recomputes each chunk and turns it into the logits gradient in place. When the entropy output got no
   gradient (GRPO logs entropy but rarely trains on it) the entropy term and its second buffer are skipped. It runs
   inside TRL's `maybe_gather_lm_head_ctx`, as TRL's kernel does: a ZeRO-3 head re-partitioned since the forward is
   gathered again (a null context otherwise).
4. Gradients of `weight` / `bias` accumulate in fp32 from the fp32 gradient tile (no per-chunk rounding to bf16, the
   bias TRL's `_addmm_fp32` comment warns about); the hidden gradient is one product per row, in the compute dtype.
5. Inputs are expected compact (only scored tokens): the caller drops `label == -100` rows before calling.
"""

from __future__ import annotations

import torch

from .chunking import chunk_bounds

OPTIONAL_OUTPUTS = ("entropy", "log_sum_sq_probs", "mean_logits", "is_top1")


def compute_dtype_of(hidden: torch.Tensor) -> torch.dtype:
    """The dtype a matmul on `hidden` runs in: autocast's when it is on, else the tensor's own."""
    device_type = hidden.device.type
    return torch.get_autocast_dtype(device_type) if torch.is_autocast_enabled(device_type) else hidden.dtype


def transform_logits_(z, logit_scale, softcap, inv_t):
    """In place: z <- softcap * tanh(z * scale / softcap) * inv_t (TRL's `_torch_transform`, no temporaries)."""
    if logit_scale != 1.0:
        z.mul_(logit_scale)
    if softcap is not None:
        z.div_(softcap).tanh_().mul_(softcap)
    if inv_t != 1.0:
        z.mul_(inv_t)
    return z


class ChunkProjector:
    """`hidden[start:end] @ weight.T (+ bias)` for each row chunk, written as fp32 into one reused buffer.

    The product runs in `compute_dtype` (default: autocast's, else hidden's; a backward passes its forward's); a
    low-precision product lands in a second reused buffer of that dtype and is copied into the fp32 one. Iterate
    inside `torch.autocast(enabled=False)`.
    """

    def __init__(self, hidden, weight, bias, bounds, compute_dtype=None):
        self.hidden, self.bounds = hidden, bounds
        self.compute_dtype = compute_dtype or compute_dtype_of(hidden)
        rows = max([end - start for start, end in bounds], default=1)
        vocab, device = weight.shape[0], hidden.device
        self.buf = torch.empty((rows, vocab), device=device, dtype=torch.float32)
        low = self.compute_dtype != torch.float32
        self.low_buf = torch.empty((rows, vocab), device=device, dtype=self.compute_dtype) if low else None
        self.weight = weight.to(self.compute_dtype)
        self.bias = None if bias is None else bias.to(self.compute_dtype)

    def rows(self, start: int, end: int) -> torch.Tensor:
        """The chunk's hidden rows in the compute dtype."""
        return self.hidden[start:end].to(self.compute_dtype)

    def project(self, start: int, end: int) -> torch.Tensor:
        """The fp32 logits of rows [start, end) (a view of the reused buffer)."""
        n = end - start
        out32 = self.buf[:n]
        if self.low_buf is None:
            torch.mm(self.rows(start, end), self.weight.t(), out=out32)
            if self.bias is not None:
                out32.add_(self.bias.float())
        else:
            low = self.low_buf[:n]
            torch.mm(self.rows(start, end), self.weight.t(), out=low)
            if self.bias is not None:
                low.add_(self.bias)
            out32.copy_(low)
        return out32

    def __iter__(self):
        for start, end in self.bounds:
            yield start, end, self.project(start, end)


def rowdot(a, b):
    """sum(a * b, -1) per row without a product tile (a batched 1xV @ Vx1 GEMV)."""
    return torch.bmm(a.unsqueeze(1), b.unsqueeze(2)).view(-1)


def _allocate_outputs(n: int, device, outputs) -> dict:
    f32 = dict(device=device, dtype=torch.float32)
    out = {"log_z": torch.empty(n, **f32), "target_logit": torch.empty(n, **f32)}
    for name in ("entropy", "log_sum_sq_probs", "mean_logits"):
        out[name] = torch.empty(n, **f32) if name in outputs else None
    out["is_top1"] = torch.empty(n, device=device, dtype=torch.bool) if "is_top1" in outputs else None
    return out


def _fold_chunk(z, targets, out: dict, rows: slice, exp_buf) -> None:
    """One chunk of transformed logits z [n, V] into the per-row statistics of `out` (z is overwritten)."""
    out["target_logit"][rows] = z.gather(1, targets.unsqueeze(1)).squeeze(1)
    if out["mean_logits"] is not None:
        torch.sum(z, dim=1, out=out["mean_logits"][rows])
    if out["is_top1"] is not None:
        # `argmax` returns the first maximum: a tie with an earlier token is not a top-1 prediction (as TRL)
        torch.eq(z.argmax(1), targets, out=out["is_top1"][rows])
    m = z.amax(1)
    z.sub_(m.unsqueeze(1))  # z - max: every exp below is <= 1
    if exp_buf is not None:
        e = torch.exp(z, out=exp_buf[: z.shape[0]])
        s = e.sum(1)
        if out["entropy"] is not None:  # H = log s - sum(e * (z - m)) / s
            torch.sub(s.log(), rowdot(e, z) / s, out=out["entropy"][rows])
        if out["log_sum_sq_probs"] is not None:
            torch.sub(rowdot(e, e).log(), 2 * s.log(), out=out["log_sum_sq_probs"][rows])
    else:
        s = z.exp_().sum(1)
    torch.add(m, s.log(), out=out["log_z"][rows])


def _logits_grad_(z, g_lp, g_ent, targets, entropy, p_buf) -> torch.Tensor:
    """In place: log-probabilities z [n, V] (z - log Z) -> dL/dz given the gradients of log_probs and entropy."""
    if g_ent is None:  # dL/dz_j = g * (1[j = target] - p_j)
        z.exp_().mul_(-g_lp.unsqueeze(1))
    else:  # dL/dz_j = g_lp * (1[j = target] - p_j) - g_ent * p_j * (log p_j + H)
        p = torch.exp(z, out=p_buf[: z.shape[0]])
        z.add_(entropy.unsqueeze(1)).mul_(g_ent.unsqueeze(1))
        if g_lp is not None:
            z.add_(g_lp.unsqueeze(1))
        z.mul_(p).neg_()
    if g_lp is not None:
        z.scatter_add_(1, targets.unsqueeze(1), g_lp.unsqueeze(1))
    return z


class LeanLogProbFunction(torch.autograd.Function):
    """`(log_probs, entropy, log_sum_sq_probs, mean_logits, is_top1)` of `hidden @ weight.T / T` at `targets`.

    Same contract as TRL's `ChunkedLogProbFunction` (fields not in `outputs` are `None`; the last three carry no
    gradient), with `num_chunks` (>= 1: row chunks over the full vocabulary) in place of TRL's vocabulary `chunk_size`.
    """

    # Number of row chunks of the last forward / backward: lets tests check that the chunking knob acts
    last_forward_chunks = 0
    last_backward_chunks = 0

    @staticmethod
    def forward(
        ctx,
        hidden,
        weight,
        bias,
        targets,
        temperature,
        num_chunks,
        final_logit_softcapping=None,
        logit_scale=1.0,
        outputs=OPTIONAL_OUTPUTS,
    ):
        ctx.set_materialize_grads(False)
        N, V = hidden.shape[0], weight.shape[0]
        projector = ChunkProjector(hidden, weight, bias, chunk_bounds(N, int(num_chunks)))
        out = _allocate_outputs(N, hidden.device, outputs)
        need_shifted = out["entropy"] is not None or out["log_sum_sq_probs"] is not None
        exp_buf = torch.empty_like(projector.buf) if need_shifted else None
        inv_t = 1.0 / temperature
        with torch.autocast(hidden.device.type, enabled=False):
            for start, end, z in projector:
                transform_logits_(z, logit_scale, final_logit_softcapping, inv_t)
                _fold_chunk(z, targets[start:end], out, slice(start, end), exp_buf)
        LeanLogProbFunction.last_forward_chunks = len(projector.bounds)
        log_probs = out["target_logit"] - out["log_z"]
        if out["mean_logits"] is not None:
            out["mean_logits"].div_(V)
        entropy = out["entropy"]
        ctx.save_for_backward(hidden, weight, bias, targets, out["log_z"], out["log_z"] if entropy is None else entropy)
        ctx.bounds, ctx.compute_dtype = projector.bounds, projector.compute_dtype
        ctx.transform = (logit_scale, final_logit_softcapping, inv_t)
        extras = (out["log_sum_sq_probs"], out["mean_logits"], out["is_top1"])
        ctx.mark_non_differentiable(*(x for x in extras if x is not None))
        return (log_probs, entropy, *extras)

    @staticmethod
    def backward(ctx, grad_logprobs, grad_entropy, *_):
        from trl.trainer.utils import maybe_gather_lm_head_ctx

        weight, bias = ctx.saved_tensors[1:3]
        # ZeRO-3 may have re-partitioned the head since the forward: gather it again, as TRL's kernel does
        with maybe_gather_lm_head_ctx(weight, bias):
            return LeanLogProbFunction._backward(ctx, grad_logprobs, grad_entropy)

    @staticmethod
    def _backward(ctx, grad_logprobs, grad_entropy):
        hidden, weight, bias, targets, log_z, entropy = ctx.saved_tensors
        logit_scale, softcap, inv_t = ctx.transform
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        projector = ChunkProjector(hidden, weight, bias, ctx.bounds, ctx.compute_dtype)
        dtype, f32 = projector.compute_dtype, dict(device=hidden.device, dtype=torch.float32)
        grad_hidden = torch.zeros(hidden.shape, device=hidden.device, dtype=dtype) if need_h else None
        grad_weight = torch.zeros(weight.shape, **f32) if need_w else None
        grad_bias = torch.zeros(weight.shape[0], **f32) if need_b else None
        if hidden.shape[0] == 0 or (grad_logprobs is None and grad_entropy is None) or not (need_h or need_w or need_b):
            return grads_out(grad_hidden, grad_weight, grad_bias, hidden, weight, bias)
        g_lp = None if grad_logprobs is None else grad_logprobs.float()
        g_ent = None if grad_entropy is None else grad_entropy.float()
        p_buf = torch.empty_like(projector.buf) if g_ent is not None else None  # log p and p at once
        t_buf = torch.empty_like(projector.buf) if softcap is not None else None  # tanh for softcap's derivative
        with torch.autocast(hidden.device.type, enabled=False):
            for start, end, z in projector:
                t = transform_keeping_tanh_(z, logit_scale, softcap, inv_t, t_buf)
                z.sub_(log_z[start:end].unsqueeze(1))  # z <- log p
                _logits_grad_(
                    z,
                    None if g_lp is None else g_lp[start:end],
                    None if g_ent is None else g_ent[start:end],
                    targets[start:end],
                    entropy[start:end],
                    p_buf,
                )
                chain_transform_(z, logit_scale, softcap, inv_t, t)
                accumulate_grads(z, projector, start, end, grad_hidden, grad_weight, grad_bias)
        LeanLogProbFunction.last_backward_chunks = len(projector.bounds)
        return grads_out(grad_hidden, grad_weight, grad_bias, hidden, weight, bias)


def transform_keeping_tanh_(z, logit_scale, softcap, inv_t, t_buf):
    """transform_logits_, keeping tanh(z * scale / softcap) in `t_buf` for the backward of the softcap."""
    if logit_scale != 1.0:
        z.mul_(logit_scale)
    t = None
    if softcap is not None:
        t = torch.tanh(z.div_(softcap), out=t_buf[: z.shape[0]])
        z.copy_(t).mul_(softcap)
    if inv_t != 1.0:
        z.mul_(inv_t)
    return t


def chain_transform_(z, logit_scale, softcap, inv_t, t) -> None:
    """In place: dL/d(transformed z) -> dL/d(raw logits), through temperature, softcap and scale."""
    if inv_t != 1.0:
        z.mul_(inv_t)
    if softcap is not None:
        z.mul_(t.square_().neg_().add_(1.0))
    if logit_scale != 1.0:
        z.mul_(logit_scale)


def accumulate_grads(z, projector, start, end, grad_hidden, grad_weight, grad_bias) -> None:
    """The chunk's logits gradient z [n, V] into the hidden, weight and bias gradients."""
    if grad_hidden is not None:
        if projector.low_buf is None:
            torch.mm(z, projector.weight, out=grad_hidden[start:end])
        else:
            torch.mm(projector.low_buf[: end - start].copy_(z), projector.weight, out=grad_hidden[start:end])
    if grad_weight is not None:
        grad_weight.addmm_(z.t(), projector.rows(start, end).float())
    if grad_bias is not None:
        grad_bias.add_(z.sum(0))


def grads_out(grad_hidden, grad_weight, grad_bias, hidden, weight, bias):
    return (
        None if grad_hidden is None else grad_hidden.to(hidden.dtype),
        None if grad_weight is None else grad_weight.to(weight.dtype),
        None if grad_bias is None else grad_bias.to(bias.dtype),
        None,
        None,
        None,
        None,
        None,
        None,
    )
