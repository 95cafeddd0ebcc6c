"""Sequence-tiled MLP: a position-wise MLP run over shards of the tokens, so its `[N, intermediate]` tensors exist for
one shard at a time (DeepSpeed's TiledMLP, ALST, arXiv 2506.13996).

`tiled_mlp(run, x, params, shard_tokens)` equals `run(x)` for any `run` that maps each token on its own (a dense MLP:
no token sees another). Choices, and why:
1. Forward: the shards run under no_grad and only the MLP's input is saved for the backward; the backward recomputes
   each shard with grad and back-propagates it at once, so the gate/up/activation tensors and their gradients live
   for one shard. Inside a checkpointed decoder layer this is the layer's recompute: the per-layer transient that
   activation offload cannot reach follows the shard, not the group.
2. The trainable parameters are inputs of the autograd Function, and their gradients (summed over shards) are its
   outputs, so autograd accumulates them once per backward, as for an untiled MLP (DDP's hooks see one gradient).
3. The backward replays the forward's random state (CPU, and the input's CUDA device) and autocast state, so dropout
   inside the MLP (LoRA dropout) draws the masks of the forward, as torch's checkpointing does.
4. Without grad (old-policy and reference passes) the shards simply run one after the other: no recompute at all.
"""

from __future__ import annotations

import torch


def shard_bounds(tokens: int, shard_tokens: int) -> list[tuple[int, int]]:
    """`[start, end)` token ranges of at most `shard_tokens` each (the last may be shorter)."""
    return [(start, min(start + shard_tokens, tokens)) for start in range(0, tokens, shard_tokens)]


def _run_shards(run, flat: torch.Tensor, shard_tokens: int) -> torch.Tensor:
    return torch.cat([run(flat[s:e]) for s, e in shard_bounds(flat.shape[0], shard_tokens)])


def _autocast_state(device_type: str) -> tuple[bool, torch.dtype]:
    return torch.is_autocast_enabled(device_type), torch.get_autocast_dtype(device_type)


class TiledMLPFunction(torch.autograd.Function):
    """`run(x)` computed and differentiated shard by shard (module docstring)."""

    @staticmethod
    def forward(ctx, run, shard_tokens: int, x: torch.Tensor, *params: torch.Tensor) -> torch.Tensor:
        ctx.run, ctx.shard_tokens, ctx.params = run, shard_tokens, params
        ctx.cpu_rng = torch.get_rng_state()
        ctx.cuda_rng = torch.cuda.get_rng_state(x.device) if x.device.type == "cuda" else None
        ctx.autocast = _autocast_state(x.device.type)
        ctx.save_for_backward(x)
        flat = x.reshape(-1, x.shape[-1])
        return _run_shards(run, flat, shard_tokens).reshape(*x.shape[:-1], -1)

    @staticmethod
    def backward(ctx, grad_output: torch.Tensor):
        (x,) = ctx.saved_tensors
        flat = x.detach().reshape(-1, x.shape[-1])
        grad_flat = grad_output.reshape(-1, grad_output.shape[-1])
        want_x = ctx.needs_input_grad[2]
        params = [p for p, needed in zip(ctx.params, ctx.needs_input_grad[3:]) if needed]
        grad_x = torch.empty_like(flat) if want_x else None
        grad_params: list[torch.Tensor | None] = [None] * len(params)
        enabled, dtype = ctx.autocast
        devices = [x.device] if ctx.cuda_rng is not None else []
        with torch.random.fork_rng(devices=devices, device_type="cuda"):  # the CPU state is always forked
            torch.set_rng_state(ctx.cpu_rng)
            if ctx.cuda_rng is not None:
                torch.cuda.set_rng_state(ctx.cuda_rng, x.device)
            with torch.enable_grad(), torch.autocast(x.device.type, dtype=dtype, enabled=enabled):
                for s, e in shard_bounds(flat.shape[0], ctx.shard_tokens):
                    shard = flat[s:e].detach().requires_grad_(want_x)
                    inputs = ([shard] if want_x else []) + params
                    grads = torch.autograd.grad(ctx.run(shard), inputs, grad_flat[s:e], allow_unused=True)
                    if want_x:
                        grad_x[s:e] = grads[0]
                        grads = grads[1:]
                    for i, g in enumerate(grads):
                        if g is not None:
                            grad_params[i] = g if grad_params[i] is None else grad_params[i].add_(g)
        grad_iter = iter(grad_params)
        param_grads = [next(grad_iter) if needed else None for needed in ctx.needs_input_grad[3:]]
        return None, None, None if grad_x is None else grad_x.reshape(x.shape), *param_grads


def tiled_mlp(run, x: torch.Tensor, params, shard_tokens: int) -> torch.Tensor:
    """`run(x)` over shards of `shard_tokens` tokens (module docstring); `params`: the trainable tensors `run` reads."""
    if not torch.is_grad_enabled() or not (x.requires_grad or any(p.requires_grad for p in params)):
        flat = x.reshape(-1, x.shape[-1])
        return _run_shards(run, flat, shard_tokens).reshape(*x.shape[:-1], -1)
    return TiledMLPFunction.apply(run, shard_tokens, x, *params)
