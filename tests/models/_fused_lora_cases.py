"""The cases of the fused LoRA layer's parity suite (tests/ops/test_fused_lora.py, which explains the rule), shared
with its CUDA run (tests/gpu/test_gpu_fused_lora.py): a PEFT LoRA layer on odd shapes, its float64 copy, the loss and
every gradient, the rule's violations."""

from __future__ import annotations

import copy

import torch
from torch import nn

from slimrl.models import lora_speed

IN, OUT, R, ROWS, COLS = 37, 53, 5, 3, 7
CASES = {  # name: (base dtype, adapter dtype, autocast dtype or None)
    "fp32": (torch.float32, torch.float32, None),
    "bf16": (torch.bfloat16, torch.bfloat16, None),
    "bf16-autocast": (torch.bfloat16, torch.float32, torch.bfloat16),
}


class _Proj(nn.Module):
    def __init__(self, bias=True):
        super().__init__()
        self.proj = nn.Linear(IN, OUT, bias=bias)

    def forward(self, x):
        return self.proj(x)


def _peft(base_dtype, adapter_dtype, dropout=0.0, bias="all", seed=0):
    """A PEFT LoRA layer (B nonzero, so every gradient is) and its float64 copy."""
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(seed)
    model = get_peft_model(
        _Proj(), LoraConfig(r=R, lora_alpha=7, lora_dropout=dropout, target_modules=["proj"], bias=bias)
    )
    layer = model.base_model.model.proj
    nn.init.normal_(layer.lora_B["default"].weight, std=0.3)
    layer.base_layer.to(base_dtype)
    for module in (layer.lora_A, layer.lora_B):
        module.to(adapter_dtype)  # peft's autocast_adapter_dtype: fp32 adapters over a bf16 base
    return model, copy.deepcopy(model).double()


def _run(model, x, autocast_dtype):
    """(loss, {x and every trainable parameter: gradient}) of a fixed quadratic loss."""
    model.zero_grad(set_to_none=True)
    x = x.detach().clone().requires_grad_(True)
    with torch.autocast(x.device.type, dtype=autocast_dtype or torch.bfloat16, enabled=autocast_dtype is not None):
        y = model(x)
    weights = torch.linspace(-1, 1, y.shape[-1], dtype=torch.float64, device=x.device)
    loss = (y.double() * weights).pow(2).sum() / y.shape[-1]
    loss.backward()
    grads = {_short(n): p.grad.double().cpu() for n, p in model.named_parameters() if p.grad is not None}
    return {"loss": loss.detach().cpu(), "x": x.grad.double().cpu(), **grads}


def _short(name: str) -> str:
    """lora_A / lora_B / bias / weight of a parameter name."""
    parts = name.split(".")
    return next((p for p in parts if p.startswith("lora_")), parts[-1])


def _unit(dtype) -> float:
    return torch.finfo(dtype).eps / 2


def _violations(ours, stock, ref, unit) -> list[str]:
    """The quantities where e(ours) > 2 e(stock) + 2 u |ref| (module docstring)."""
    assert ours.keys() == stock.keys() == ref.keys() and len(ours) == 5, sorted(ours)
    bad = []
    for key in ours:
        e_ours, e_stock = (ours[key] - ref[key]).norm(), (stock[key] - ref[key]).norm()
        if e_ours > 2 * e_stock + 2 * unit * ref[key].norm():
            bad.append(f"{key}: {e_ours:.3g} vs stock {e_stock:.3g}, |ref| {ref[key].norm():.3g}")
    return bad


def _compare(case, wrong_scaling=1.0, seed=0, device="cpu"):
    """The rule's violations for one case (tests/gpu/test_gpu_fused_lora.py runs it on CUDA; the reference stays on
    the CPU)."""
    base_dtype, adapter_dtype, autocast_dtype = CASES[case]
    stock, ref = _peft(base_dtype, adapter_dtype, seed=seed)
    stock.to(device)
    fused = lora_speed.speed_up_lora(copy.deepcopy(stock), fused=True)
    fused.base_model.model.proj.scaling["default"] *= wrong_scaling
    x = torch.randn(ROWS, COLS, IN, generator=torch.Generator().manual_seed(seed)).to(base_dtype)
    got, want = _run(fused, x.to(device), autocast_dtype), _run(stock, x.to(device), autocast_dtype)
    return _violations(got, want, _run(ref, x.double(), None), _unit(autocast_dtype or base_dtype))
