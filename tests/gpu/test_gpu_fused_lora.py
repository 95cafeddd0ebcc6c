"""slimrl's LoRA speed levers on CUDA: the fused LoRA layer against PEFT's eager path and a float64 reference (the
rule and cases of tests/ops/test_fused_lora.py, run on the GPU: fp32, pure bf16, bf16 autocast over fp32 adapters),
its negative control, "auto" turning the fused forward on for a model on CUDA, and a 4-bit base on the GPU."""

import copy
import importlib.util

import pytest
import torch

from slimrl import swaps
from slimrl.models import lora_speed

from _fused_lora_cases import CASES, R, _compare, _peft
from _gpu_helpers import MARKS

pytestmark = MARKS


@pytest.mark.parametrize("case", sorted(CASES))
def test_fused_lora_matches_peft_on_cuda(case):
    assert _compare(case, device="cuda") == []


@pytest.mark.parametrize("case", sorted(CASES))
def test_negative_control_wrong_scaling_fails_on_cuda(case):
    assert _compare(case, wrong_scaling=1.05, device="cuda")


def test_auto_fuses_a_cuda_model():
    model, _ = _peft(torch.bfloat16, torch.float32)
    lora_speed.speed_up_lora(model.to("cuda"))  # the defaults: "auto" and the input casts
    assert set(swaps.swapped(model.base_model.model.proj)) == {"forward", "_cast_input_dtype"}


@pytest.mark.skipif(importlib.util.find_spec("bitsandbytes") is None, reason="bitsandbytes not installed")
def test_four_bit_base_on_cuda_under_autocast():
    import bitsandbytes as bnb
    from peft import LoraConfig, get_peft_model
    from torch import nn

    torch.manual_seed(0)
    base = nn.Sequential(bnb.nn.Linear4bit(37, 53, compute_dtype=torch.bfloat16, quant_type="nf4")).to("cuda")
    stock = get_peft_model(base, LoraConfig(r=R, lora_alpha=7, target_modules=["0"]))
    nn.init.normal_(stock.base_model.model[0].lora_B["default"].weight, std=0.3)
    fused = lora_speed.speed_up_lora(copy.deepcopy(stock), fused=True)
    x = torch.randn(3, 7, 37, device="cuda", dtype=torch.bfloat16)
    outs = []
    for model in (stock, fused):
        xi = x.clone().requires_grad_(True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            y = model(xi)
        y.float().pow(2).sum().backward()
        outs.append([y.float(), xi.grad.float()] + [p.grad for p in model.parameters() if p.grad is not None])
    assert len(outs[0]) == len(outs[1]) == 4
    for got, want in zip(outs[1], outs[0]):  # bf16: within a few roundings (u = 2^-8) of PEFT's own
        assert (got - want).norm() <= 4 * 2.0**-8 * want.norm()
