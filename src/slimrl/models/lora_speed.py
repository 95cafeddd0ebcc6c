"""Two speed levers on the LoRA layers of a PeftModel: input casts skipped under autocast, and the fused LoRA forward.

`speed_up_lora(model, fused="auto", skip_input_casts=True)` swaps methods on peft's LoRA layers (instance attributes,
recorded by slimrl.swaps, so `slimrl.describe(model)` lists them); `restore_lora(model)` takes both off.
FastLanguageModel.get_peft_model applies them with its `fused_lora` / `skip_lora_input_casts` keywords.

Choices, and why:
1. Input casts. PEFT keeps the adapters in fp32 and, in each LoRA layer's forward, casts the [N, in] input to fp32
   (`_cast_input_dtype`) before `lora_A`; under autocast the matmul casts it straight back to the autocast dtype. The
   round trip bf16 -> fp32 -> bf16 is exact, so skipping it changes no value and saves two [N, in] passes and an
   fp32 copy per layer. The swapped `_cast_input_dtype` skips the cast only while autocast is on for the input's
   device and the input already has autocast's dtype; otherwise (no autocast: PEFT computes the adapter in fp32)
   it is PEFT's own. Layers with LoRA dropout or a LoRA variant (DoRA, ...) keep PEFT's cast: dropout on a bf16
   input draws and rounds its mask in another dtype. Default on.
2. Fused forward (slimrl.ops.fused_lora): peft's LoRA `Linear` (a dense `nn.Linear` base) and bitsandbytes
   `Linear4bit` (dequantized, then the same math). It runs when the layer has one active adapter, no dropout,
   no variant, no LoRA bias, a frozen base weight, no hooks on the base layer, and (without autocast) input, base
   (a 4-bit base: its compute dtype) and adapters of one dtype; every other call (adapters disabled: the reference
   pass; merged; several adapters; `adapter_names`) is PEFT's own forward. Layers with lora_dropout > 0 or a LoRA
   variant are not swapped (a one-line notice). Default "auto": on when the model's parameters are on CUDA (the
   speed-up is from fewer memory passes on a GPU; on CPU it is available with fused=True, see
   bench/fused_lora_cpu.py).
"""

from __future__ import annotations

import types

import torch
from torch import nn

from .. import swaps
from ..notices import notice

AUTO = "auto"
FUSED_WHY = "fused LoRA forward (slimrl.ops.fused_lora; models/lora_speed.py)"
CAST_WHY = "input cast skipped under autocast (models/lora_speed.py)"


def validate_lever(name: str, value):
    """ "auto" | True | False, else a ValueError naming the keyword."""
    if value is True or value is False or value == AUTO:
        return value
    raise ValueError(f"{name} must be 'auto', True or False, got {value!r}.")


def lora_layers(model) -> list:
    """The LoRA layers of `model` that the levers know: peft's `lora.Linear` and bitsandbytes `lora.Linear4bit`."""
    from peft.tuners.lora import Linear

    kinds = (Linear,)
    try:
        from peft.tuners.lora.bnb import Linear4bit

        kinds += (Linear4bit,)
    except ImportError:  # bitsandbytes not installed
        pass
    return [m for m in model.modules() if type(m) in kinds]


def _no_dropout(layer) -> bool:
    return all(isinstance(d, nn.Identity) or d.p == 0 for d in layer.lora_dropout.values())


def _skip_cast(self, x, dtype):
    device = None if x is None else x.device.type
    if device and x.dtype != dtype and torch.is_autocast_enabled(device):
        if torch.get_autocast_dtype(device) == x.dtype:
            return x  # autocast casts the fp32 copy straight back to x's dtype: skipping it is exact
    return type(self)._cast_input_dtype(self, x, dtype)


def _sharded(*tensors) -> bool:
    from torch.distributed.tensor import DTensor

    return any(hasattr(t, "ds_id") or isinstance(t, DTensor) for t in tensors)


def _base_weight(base):
    """(weight, weight_fn) of the base layer: a dense weight, or a function dequantizing a 4-bit one; None if
    neither (another base type)."""
    if type(base) is nn.Linear:
        return base.weight, None
    weight = getattr(base, "weight", None)
    if type(weight).__name__ == "Params4bit" and getattr(weight, "quant_state", None) is not None:
        import bitsandbytes as bnb

        return None, lambda: bnb.functional.dequantize_4bit(weight.data, weight.quant_state)
    return None


def _plan(self, x, args, kwargs):
    """The fused call's operands (a, b, scaling, weight, bias, weight_fn), or None for PEFT's own forward."""
    if args or kwargs or self.disable_adapters or self.merged:
        return None
    active = [name for name in self.active_adapters if name in self.lora_A]
    if len(active) != 1 or active[0] in self.lora_variant:
        return None
    name = active[0]
    a, b, dropout = self.lora_A[name], self.lora_B[name], self.lora_dropout[name]
    base = self.get_base_layer()
    found = _base_weight(base)
    if b.bias is not None or not (isinstance(dropout, nn.Identity) or dropout.p == 0) or found is None:
        return None
    if base._forward_hooks or base._forward_pre_hooks or hasattr(base, "_hf_hook"):
        return None
    weight, weight_fn = found
    frozen = weight_fn is not None or not weight.requires_grad
    if not frozen or _sharded(a.weight, b.weight, base.weight) or a.weight.device != x.device:
        return None
    if not torch.is_autocast_enabled(x.device.type):  # PEFT computes in the adapters' (and 4-bit: compute) dtype
        base_dtype = weight.dtype if weight is not None else getattr(base, "compute_dtype", None) or x.dtype
        if len({x.dtype, a.weight.dtype, b.weight.dtype, base_dtype}) != 1:
            return None
    return a.weight, b.weight, self.scaling[name], weight, base.bias, weight_fn


def _fused_forward(self, x, *args, **kwargs):
    from ..ops.fused_lora import fused_lora_linear

    plan = _plan(self, x, args, kwargs)
    if plan is None:
        return type(self).forward(self, x, *args, **kwargs)
    a, b, scaling, weight, bias, weight_fn = plan
    return fused_lora_linear(x, a, b, scaling, weight=weight, bias=bias, weight_fn=weight_fn)


def on_cuda(model) -> bool:
    return any(p.device.type == "cuda" for p in model.parameters())


def _ours(layer, name: str) -> bool:
    return getattr(layer.__dict__.get(name), "__func__", None) in (_skip_cast, _fused_forward)


def speed_up_lora(model, fused=AUTO, skip_input_casts=True):
    """Apply the levers to `model`'s LoRA layers (module docstring); returns `model`. Idempotent."""
    fused = validate_lever("fused_lora", fused)
    skip_input_casts = validate_lever("skip_lora_input_casts", skip_input_casts)
    if fused == AUTO:
        fused = on_cuda(model)
    with_dropout = 0
    for layer in lora_layers(model):
        plain = _no_dropout(layer) and not layer.lora_variant
        if skip_input_casts and plain and not _ours(layer, "_cast_input_dtype"):
            swaps.swap(layer, "_cast_input_dtype", types.MethodType(_skip_cast, layer), CAST_WHY)
        if fused and not plain:
            with_dropout += 1
        elif fused and "forward" not in layer.__dict__:
            swaps.swap(layer, "forward", types.MethodType(_fused_forward, layer), FUSED_WHY)
    if with_dropout:
        notice(
            f"fused LoRA: {with_dropout} LoRA layers have lora_dropout > 0 or a LoRA variant and keep PEFT's forward "
            "(the fused forward assumes dropout 0)."
        )
    return model


def levers_on(model) -> dict[str, int]:
    """How many LoRA layers of `model` run each lever: {"fused_forward": n, "input_cast_skipped": m}."""
    layers = lora_layers(model)
    return {
        "fused_forward": sum(_ours(layer, "forward") for layer in layers),
        "input_cast_skipped": sum(_ours(layer, "_cast_input_dtype") for layer in layers),
    }


def restore_lora(model):
    """Take both levers off `model`'s LoRA layers (PEFT's own methods again); returns `model`."""
    for layer in lora_layers(model):
        for name in ("forward", "_cast_input_dtype"):
            if _ours(layer, name):
                swaps.restore(layer, name)
    return model
