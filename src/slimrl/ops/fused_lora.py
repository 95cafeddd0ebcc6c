"""A LoRA linear layer as one autograd function: y = x W^T (+ b) + s (x A^T) B^T, written from the math.

PEFT's LoRA Linear runs the base layer, then `lora_B(lora_A(dropout(x))) * scaling` and an add: three more [N, out]
passes (B's output, the scaling, the sum) and, under autocast, each branch saving its own copy of the input.
`fused_lora_linear` computes the same function with the LoRA product folded into the base GEMM's output (one
`addmm_` with alpha = s) and a backward written by hand:

    forward   xa = x A^T                      [N, r]   (saved for dB; r is small)
              y  = x W^T + b;  y += s xa B^T  (one addmm_ into the base output)
    backward  gb = s (g B)                    [N, r]   (g = dY; computed once, used for dA and dX)
              dX = g W + gb A                 (one mm, one addmm_)
              dA = gb^T x,  dB = s g^T xa,  db = sum of g over the rows

Choices:
- The base weight is frozen (LoRA): no dW is computed; slimrl.models.lora_speed calls this only where the base weight
  has no grad. The base bias may train (peft's bias="all"): db is computed when it is asked for.
- Precision: under autocast every operand is cast to the autocast dtype (what autocast does to PEFT's matmuls), else
  the input's dtype; the function runs with autocast off, so its matmuls use exactly that dtype. The fp32 master
  adapters stay fp32: their casts are ordinary autograd ops, so dA and dB reach them in fp32. The fold accumulates
  the LoRA product into the base output inside one GEMM (fp32 accumulation), which rounds once where PEFT rounds
  three times: the two agree within the compute dtype's rounding.
- A quantized base (bitsandbytes 4-bit) passes `weight_fn`, which dequantizes the weight; it is called in the forward
  and again in the backward, so no dense copy of the weight is kept between them.
"""

from __future__ import annotations

import torch


def compute_dtype(x: torch.Tensor) -> torch.dtype:
    """The dtype the layer computes in: autocast's for x's device when autocast is on, else x's own."""
    device = x.device.type
    if torch.is_autocast_enabled(device):
        return torch.get_autocast_dtype(device)
    return x.dtype


class FusedLoRAFunction(torch.autograd.Function):
    """y = x W^T + b + scaling (x A^T) B^T on 2-D operands of one dtype (see the module docstring)."""

    @staticmethod
    def forward(ctx, x, lora_a, lora_b, bias, weight, scaling, weight_fn):
        w = weight_fn() if weight_fn is not None else weight
        xa = x @ lora_a.t()
        out = torch.addmm(bias, x, w.t()) if bias is not None else x @ w.t()
        out.addmm_(xa, lora_b.t(), alpha=scaling)
        ctx.save_for_backward(x, xa, lora_a, lora_b, weight if weight_fn is None else None)
        ctx.scaling, ctx.weight_fn = scaling, weight_fn
        return out

    @staticmethod
    def backward(ctx, g):
        x, xa, lora_a, lora_b, weight = ctx.saved_tensors
        scaling = ctx.scaling
        with torch.autocast(g.device.type, enabled=False):
            gb = (g @ lora_b).mul_(scaling)
            dx = d_a = d_b = d_bias = None
            if ctx.needs_input_grad[0]:
                w = ctx.weight_fn() if ctx.weight_fn is not None else weight
                dx = (g @ w).addmm_(gb, lora_a)
            if ctx.needs_input_grad[1]:
                d_a = gb.t() @ x
            if ctx.needs_input_grad[2]:
                d_b = (g.t() @ xa).mul_(scaling)
            if ctx.needs_input_grad[3]:
                d_bias = g.sum(0)
        return dx, d_a, d_b, d_bias, None, None, None


def fused_lora_linear(x, lora_a, lora_b, scaling: float, weight=None, bias=None, weight_fn=None) -> torch.Tensor:
    """The LoRA linear layer's output for `x` [..., in]: weight [out, in] (or `weight_fn()` giving it), bias [out] or
    None, lora_a [r, in], lora_b [out, r]; computed in `compute_dtype(x)`, returned in it."""
    dtype = compute_dtype(x)
    leading = x.shape[:-1]
    x2 = x.reshape(-1, x.shape[-1]).to(dtype)
    lora_a, lora_b = lora_a.to(dtype), lora_b.to(dtype)
    bias = None if bias is None else bias.to(dtype)
    if weight_fn is None:
        weight = weight.to(dtype)
    else:
        inner = weight_fn

        def weight_fn():
            return inner().to(dtype)

    with torch.autocast(x.device.type, enabled=False):
        out = FusedLoRAFunction.apply(x2, lora_a, lora_b, bias, weight, float(scaling), weight_fn)
    return out.reshape(*leading, out.shape[-1])
