"""4-bit (bitsandbytes NF4) weights on CPU dequantized once per `generate` call instead of once per token.

bitsandbytes on CPU (with slimrl's repack guard, models/quantization.py) runs a `Linear4bit` forward without grad as:
dequantize the weight into the compute dtype, then `F.linear`. Decoding runs every layer once per new token, so a
`generate` of T new tokens dequantizes every weight T times. Inside slimrl's `model.generate` (cached_generate.py;
the patched trainers' rollouts call it too) each CPU `Linear4bit`'s forward is swapped for one that keeps its
dequantized weight from its first call to the end of the call; then the forwards are restored and the copies freed.

Measured (bench/rollout_overhead.py; SmolLM2-135M NF4 with LoRA r=16, bf16 compute, 8 x 32 new tokens, 1 thread of
a shared 2-core Xeon; docs/unsloth-notebooks.md): bitsandbytes' per-token path takes 1.08x and 1.34x the CPU time of
dequantizing once (two configs), the same tokens; a patched GRPO rollout then takes 0.86x the CPU time of plain
`model.generate` on the same 4-bit weights.

Choices:
1. The same numbers: the kept weight is what bitsandbytes' CPU path computes for each call (its `dequantize_4bit` op
   into the compute dtype), multiplied as it multiplies (input and bias in the compute dtype, `F.linear`, the output
   back in the input's dtype). Parity with bitsandbytes' own forward is tested to the bit (tests/models/).
2. Scope: weights on the CPU, forwards without grad (`generate` runs under no_grad; a forward with grad goes to
   bitsandbytes), weights neither repacked by bitsandbytes' AVX512-BF16 path nor double-quantized (slimrl loads
   neither), a layer whose compute dtype is set (bitsandbytes sets it at its first forward). Anything else runs
   bitsandbytes' forward, as before. CUDA: nothing changes (its kernels dequantize inside the matmul).
3. Memory: the copies live for the call, 2 bytes per quantized weight in bf16 compute (4 in fp32): four (eight)
   times the NF4 weights. SmolLM2-135M: 212 MB beside 53 MB of NF4 weights; a 7B model about 13 GB. Where the
   copies would take more than half of the memory available now (MemAvailable, ops/row_groups.py), a call keeps
   bitsandbytes' path and says so once.
4. A `generate` inside a `generate` (nested calls) keeps the outer call's copies.
"""

from __future__ import annotations

import contextlib
import sys
import types

import torch

from .. import swaps
from ..notices import notice

WHY = "4-bit weights on CPU dequantized once per generate call (dequantized_generate.py)"
SHARE_OF_AVAILABLE = 0.5  # the most of MemAvailable the copies may take (choice 3)


def _linear4bit_class():
    """bitsandbytes' Linear4bit if bitsandbytes is loaded (a model with 4-bit layers has loaded it), else None."""
    bnb = sys.modules.get("bitsandbytes")
    return None if bnb is None else bnb.nn.Linear4bit


def _eligible(module) -> bool:
    weight = module.weight
    state = getattr(weight, "quant_state", None)
    return (
        weight.device.type == "cpu"
        and state is not None
        and not state.nested
        and not getattr(state, "packing_format_for_cpu", False)
        and module.compute_type_is_set
        and module.compute_dtype is not None
    )


def cpu_4bit_layers(model) -> list:
    """The `Linear4bit` modules of `model` this module dequantizes once per call (choice 2)."""
    linear4bit = _linear4bit_class()
    if linear4bit is None:
        return []
    return [m for m in model.modules() if isinstance(m, linear4bit) and _eligible(m)]


def dequantized_bytes(layers) -> int:
    """Bytes the dequantized copies of `layers` take (choice 3)."""
    return sum(m.weight.quant_state.shape.numel() * m.compute_dtype.itemsize for m in layers)


def dequantize(module) -> torch.Tensor:
    """The weight bitsandbytes' CPU path computes for a forward of `module` (choice 1)."""
    state = module.weight.quant_state
    packed = module.weight.data.view(-1, 1)
    return torch.ops.bitsandbytes.dequantize_4bit.default(
        packed, state.absmax, state.blocksize, state.quant_type, state.shape, module.compute_dtype
    )


def _forward_once(copies: dict):
    def forward(self, x, *args, **kwargs):
        if args or kwargs or torch.is_grad_enabled() or x.shape[-1] != self.weight.quant_state.shape[1]:
            return type(self).forward(self, x, *args, **kwargs)
        weight = copies.get(id(self))
        if weight is None:
            weight = copies[id(self)] = dequantize(self)
        bias = None if self.bias is None else self.bias.to(self.compute_dtype)
        return torch.nn.functional.linear(x.to(self.compute_dtype), weight, bias).to(x.dtype)

    return forward


def _available_bytes() -> int | None:
    from ..ops.row_groups import free_memory_bytes

    return free_memory_bytes(torch.device("cpu"))


@contextlib.contextmanager
def dequantized_once(model):
    """Inside the block, `model`'s CPU 4-bit layers dequantize their weights once (at their first forward), not per
    call; afterwards their forwards are bitsandbytes' again and the copies are freed."""
    layers = cpu_4bit_layers(model)
    if not layers or any(swaps.latest_why(m, "forward") == WHY for m in layers):
        yield model  # no 4-bit layers on the CPU, or an outer generate holds them dequantized already
        return
    needed, available = dequantized_bytes(layers), _available_bytes()
    if available is not None and needed > SHARE_OF_AVAILABLE * available:
        notice(
            f"generate on a 4-bit model on CPU: its weights dequantized once per call would take "
            f"{needed / 2**30:.2f} GiB of {available / 2**30:.2f} GiB available; they are dequantized per token "
            "instead (slower, as bitsandbytes runs them)."
        )
        yield model
        return
    copies: dict[int, torch.Tensor] = {}
    for module in layers:
        swaps.swap(module, "forward", types.MethodType(_forward_once(copies), module), WHY)
    try:
        yield model
    finally:
        for module in layers:
            swaps.restore(module, "forward")
        copies.clear()
