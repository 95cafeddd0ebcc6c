"""Memory-lean per-token log-probabilities of `hidden @ weight.T` (torch ops, any device).

Choices, and why they differ from TRL 1.16's `trl.kernels.chunked_logprob.ChunkedLogProbFunction` torch fallback:

* Row chunks over the FULL vocabulary instead of `[4096, 32768]` online-logsumexp tiles. A row chunk of `n` tokens
  holds `n x V` fp32 logits; `n` comes from a byte budget (`AUTO_BUDGET_BYTES`, 128 MiB for all scratch buffers of
  one fold) or from the caller (`num_chunks` balanced chunks, the `_slimrl_num_chunks` knob). Seeing the whole row at once makes
  the fold a plain max / exp / sum: no rescaling, no `max_before_target` tile mask (`argmax` gives the first maximum).
* Every tile-sized operation is in place on one or two reused fp32 buffers: the projection writes into the buffer,
  scale / softcap / temperature are applied in place, `exp` goes to the second buffer only when entropy or
  `log_sum_sq_probs` needs the shifted logits too, and row dot products (`sum p*z`, `sum p^2`) use `bmm` so no
  product tile is allocated. TRL's eager fallback allocates 4-6 tile-sized temporaries per tile.
* Backward recomputes each chunk and turns it into the logits gradient in place. When the entropy output got no
  gradient (GRPO logs entropy but rarely trains on it) the entropy term and its second buffer are skipped.
* Gradients of `weight` / `bias` accumulate in fp32 from the fp32 gradient tile (no per-chunk rounding to bf16, the
  bias TRL's `_addmm_fp32` comment warns about); the hidden gradient is one product per row, in the compute dtype.
* Inputs are expected compact (only scored tokens): the caller drops `label == -100` rows before calling.
"""

from __future__ import annotations

import math

import torch

OPTIONAL_OUTPUTS = ("entropy", "log_sum_sq_probs", "mean_logits", "is_top1")
# Scratch budget of one fold (forward or backward) when the caller leaves the chunking to us: all fp32 row buffers
# together stay under it. 128 MiB = 220 tokens at V=152k with two buffers, 1000+ tokens at V=32k.
AUTO_BUDGET_BYTES = 128 * 1024**2


def resolve_num_chunks(num_tokens: int, vocab: int, num_chunks: int, buffers: int = 2) -> int:
    """Chunk count: `num_chunks >= 1` is taken as is (capped at one token per chunk), `-1` picks from the budget."""
    if num_tokens <= 0:
        return 1
    if num_chunks is not None and num_chunks >= 1:
        return min(num_chunks, num_tokens)
    rows = max(1, AUTO_BUDGET_BYTES // (buffers * 4 * max(vocab, 1)))
    return math.ceil(num_tokens / rows)


def chunk_bounds(num_tokens: int, num_chunks: int) -> list[tuple[int, int]]:
    """`num_chunks` contiguous, balanced (sizes differ by at most one) row ranges, like `torch.tensor_split`."""
    k = max(1, min(num_chunks, num_tokens))
    base, extra = divmod(num_tokens, k)
    bounds, start = [], 0
    for i in range(k):
        end = start + base + (i < extra)
        bounds.append((start, end))
        start = end
    return [b for b in bounds if b[1] > b[0]]


def _project(out32, low_buf, hidden_chunk, weight, bias, compute_dtype):
    """out32[:n] = hidden_chunk @ weight.T (+ bias), the product taken in `compute_dtype`, stored as fp32."""
    if compute_dtype == torch.float32:
        torch.mm(hidden_chunk, weight.t(), out=out32)
        if bias is not None:
            out32.add_(bias.float())
    else:
        torch.mm(hidden_chunk, weight.t(), out=low_buf)
        if bias is not None:
            low_buf.add_(bias)
        out32.copy_(low_buf)


def _transform_(z, logit_scale, softcap, inv_t):
    """In place: z <- softcap * tanh(z * scale / softcap) * inv_t (TRL's `_torch_transform`, no temporaries)."""
    if logit_scale != 1.0:
        z.mul_(logit_scale)
    if softcap is not None:
        z.div_(softcap).tanh_().mul_(softcap)
    if inv_t != 1.0:
        z.mul_(inv_t)
    return z


def _rowdot(a, b):
    """sum(a * b, -1) per row without a product tile (a batched 1xV @ Vx1 GEMV)."""
    return torch.bmm(a.unsqueeze(1), b.unsqueeze(2)).view(-1)


class LeanLogProbFunction(torch.autograd.Function):
    """`(log_probs, entropy, log_sum_sq_probs, mean_logits, is_top1)` of `hidden @ weight.T / T` at `targets`.

    Same contract as TRL's `ChunkedLogProbFunction` (fields not in `outputs` are `None`; the last three carry no
    gradient), with `num_chunks` (>= 1: row chunks over the full vocabulary) in place of TRL's vocabulary `chunk_size`.
    """

    # Number of row chunks of the last forward / backward: lets tests check that the chunking knob acts
    last_forward_chunks = 0
    last_backward_chunks = 0

    @staticmethod
    def forward(ctx, hidden, weight, bias, targets, temperature, num_chunks, final_logit_softcapping=None,
                logit_scale=1.0, outputs=OPTIONAL_OUTPUTS):
        ctx.set_materialize_grads(False)
        device = hidden.device
        N, V = hidden.shape[0], weight.shape[0]
        compute_dtype = torch.get_autocast_dtype(device.type) if torch.is_autocast_enabled(device.type) else hidden.dtype
        want = {name: name in outputs for name in OPTIONAL_OUTPUTS}
        need_shifted = want["entropy"] or want["log_sum_sq_probs"]
        bounds = chunk_bounds(N, int(num_chunks))
        rows = max([end - start for start, end in bounds], default=1)
        f32 = dict(device=device, dtype=torch.float32)

        log_z = torch.empty(N, **f32)
        target_logit = torch.empty(N, **f32)
        entropy = torch.empty(N, **f32) if want["entropy"] else None
        log_sum_sq = torch.empty(N, **f32) if want["log_sum_sq_probs"] else None
        mean_logits = torch.empty(N, **f32) if want["mean_logits"] else None
        is_top1 = torch.empty(N, device=device, dtype=torch.bool) if want["is_top1"] else None

        buf = torch.empty((rows, V), **f32)
        exp_buf = torch.empty((rows, V), **f32) if need_shifted else None
        low_buf = torch.empty((rows, V), device=device, dtype=compute_dtype) if compute_dtype != torch.float32 else None
        w = weight.to(compute_dtype)
        b = None if bias is None else bias.to(compute_dtype)
        inv_t = 1.0 / temperature
        chunks = 0
        with torch.autocast(device.type, enabled=False):
            for start, end in bounds:
                n = end - start
                z = buf[:n]
                _project(z, None if low_buf is None else low_buf[:n], hidden[start:end].to(compute_dtype), w, b,
                         compute_dtype)
                _transform_(z, logit_scale, final_logit_softcapping, inv_t)
                tgt = targets[start:end]
                target_logit[start:end] = z.gather(1, tgt.unsqueeze(1)).squeeze(1)
                if mean_logits is not None:
                    torch.sum(z, dim=1, out=mean_logits[start:end])
                if is_top1 is not None:
                    # `argmax` returns the first maximum: a tie with an earlier token is not a top-1 prediction (as TRL)
                    torch.eq(z.argmax(1), tgt, out=is_top1[start:end])
                m = z.amax(1)
                z.sub_(m.unsqueeze(1))  # z - max: every exp below is <= 1
                if need_shifted:
                    e = torch.exp(z, out=exp_buf[:n])
                    s = e.sum(1)
                    if entropy is not None:
                        # H = log s - sum(e * (z - m)) / s
                        torch.sub(s.log(), _rowdot(e, z) / s, out=entropy[start:end])
                    if log_sum_sq is not None:
                        torch.sub(_rowdot(e, e).log(), 2 * s.log(), out=log_sum_sq[start:end])
                else:
                    s = z.exp_().sum(1)
                torch.add(m, s.log(), out=log_z[start:end])
                chunks += 1
        del buf, exp_buf, low_buf
        LeanLogProbFunction.last_forward_chunks = chunks
        log_probs = target_logit - log_z
        if mean_logits is not None:
            mean_logits.div_(V)

        ctx.save_for_backward(hidden, weight, bias, targets, log_z, log_z if entropy is None else entropy)
        ctx.compute_dtype = compute_dtype
        ctx.bounds, ctx.rows = bounds, rows
        ctx.transform = (logit_scale, final_logit_softcapping, inv_t)
        ctx.mark_non_differentiable(*(x for x in (log_sum_sq, mean_logits, is_top1) if x is not None))
        return log_probs, entropy, log_sum_sq, mean_logits, is_top1

    @staticmethod
    def backward(ctx, grad_logprobs, grad_entropy, *_):
        hidden, weight, bias, targets, log_z, entropy = ctx.saved_tensors
        compute_dtype, rows, bounds = ctx.compute_dtype, ctx.rows, ctx.bounds
        logit_scale, softcap, inv_t = ctx.transform
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        N, V = hidden.shape[0], weight.shape[0]
        device = hidden.device
        f32 = dict(device=device, dtype=torch.float32)
        grad_hidden = torch.zeros(hidden.shape, device=device, dtype=compute_dtype) if need_h else None
        grad_weight = torch.zeros(weight.shape, **f32) if need_w else None
        grad_bias = torch.zeros(V, **f32) if need_b else None
        if N == 0 or (grad_logprobs is None and grad_entropy is None) or not (need_h or need_w or need_b):
            return _grads_out(grad_hidden, grad_weight, grad_bias, hidden, weight, bias)

        g_lp = None if grad_logprobs is None else grad_logprobs.float()
        g_ent = None if grad_entropy is None else grad_entropy.float()
        buf = torch.empty((rows, V), **f32)
        # The entropy term needs log p and p at once; softcap needs tanh for its derivative
        p_buf = torch.empty((rows, V), **f32) if g_ent is not None else None
        t_buf = torch.empty((rows, V), **f32) if softcap is not None else None
        low_buf = torch.empty((rows, V), device=device, dtype=compute_dtype) if compute_dtype != torch.float32 else None
        w = weight.to(compute_dtype)
        b = None if bias is None else bias.to(compute_dtype)
        chunks = 0
        with torch.autocast(device.type, enabled=False):
            for start, end in bounds:
                n = end - start
                h = hidden[start:end].to(compute_dtype)
                z = buf[:n]
                _project(z, None if low_buf is None else low_buf[:n], h, w, b, compute_dtype)
                if logit_scale != 1.0:
                    z.mul_(logit_scale)
                if softcap is not None:
                    t = torch.tanh(z.div_(softcap), out=t_buf[:n])
                    z.copy_(t).mul_(softcap)
                if inv_t != 1.0:
                    z.mul_(inv_t)
                z.sub_(log_z[start:end].unsqueeze(1))  # z <- log p
                if g_ent is None:
                    # dL/dz_j = g * (1[j = target] - p_j)
                    z.exp_().mul_(-g_lp[start:end].unsqueeze(1))
                else:
                    # dL/dz_j = g_lp * (1[j = target] - p_j) - g_ent * p_j * (log p_j + H)
                    p = torch.exp(z, out=p_buf[:n])
                    z.add_(entropy[start:end].unsqueeze(1)).mul_(g_ent[start:end].unsqueeze(1))
                    if g_lp is not None:
                        z.add_(g_lp[start:end].unsqueeze(1))
                    z.mul_(p).neg_()
                if g_lp is not None:
                    z.scatter_add_(1, targets[start:end].unsqueeze(1), g_lp[start:end].unsqueeze(1))
                if inv_t != 1.0:
                    z.mul_(inv_t)
                if softcap is not None:
                    z.mul_(t_buf[:n].square_().neg_().add_(1.0))
                if logit_scale != 1.0:
                    z.mul_(logit_scale)
                if grad_hidden is not None:
                    if low_buf is None:
                        torch.mm(z, w, out=grad_hidden[start:end])
                    else:
                        torch.mm(low_buf[:n].copy_(z), w, out=grad_hidden[start:end])
                if grad_weight is not None:
                    grad_weight.addmm_(z.t(), h.float())
                if grad_bias is not None:
                    grad_bias.add_(z.sum(0))
                chunks += 1
        LeanLogProbFunction.last_backward_chunks = chunks
        return _grads_out(grad_hidden, grad_weight, grad_bias, hidden, weight, bias)


def _grads_out(grad_hidden, grad_weight, grad_bias, hidden, weight, bias):
    return (
        None if grad_hidden is None else grad_hidden.to(hidden.dtype),
        None if grad_weight is None else grad_weight.to(weight.dtype),
        None if grad_bias is None else grad_bias.to(bias.dtype),
        None, None, None, None, None, None,
    )
