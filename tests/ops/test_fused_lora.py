"""slimrl.ops.fused_lora and its swap onto peft's LoRA layers (slimrl.models.lora_speed), against PEFT's eager forward
and a naive float64 reference.

Odd shapes (in=37, out=53, r=5, rows 3 x 7); loss and every gradient (x, A, B, the base bias) in fp32, pure bf16 and
bf16 autocast over fp32 adapters. The rule: the fused layer's error against the float64 reference is at most twice
PEFT's own plus 2 units of the compute dtype's rounding of the reference (both compute the same function in that
dtype, in another order: the fused GEMM rounds the LoRA sum once where PEFT rounds three times). Negative control: a
scaling 5% off must fail that rule. Also: float64 gradcheck, disabled and merged adapters, the swap's record and
reversal, the dropout fallback and its notice, a 4-bit base.
"""

from __future__ import annotations

import copy
import importlib.util
import logging

import pytest
import torch
from torch import nn

from slimrl import swaps
from slimrl.models import lora_speed
from slimrl.ops.fused_lora import fused_lora_linear

from _fused_lora_cases import CASES, COLS, IN, OUT, ROWS, R, _compare, _peft, _Proj, _run


@pytest.mark.parametrize("case", sorted(CASES))
def test_parity_with_peft_loss_and_every_gradient(case):
    assert _compare(case) == []


@pytest.mark.parametrize("case", sorted(CASES))
def test_negative_control_wrong_scaling_fails(case):
    assert _compare(case, wrong_scaling=1.05)


def test_gradcheck_float64():
    g = torch.Generator().manual_seed(1)
    x, a, b = (torch.randn(*s, dtype=torch.float64, generator=g) for s in ((2, 5, 7), (3, 7), (11, 3)))
    weight, bias = torch.randn(11, 7, dtype=torch.float64, generator=g), torch.randn(11, dtype=torch.float64)
    inputs = [t.requires_grad_(True) for t in (x, a, b, bias)]
    assert torch.autograd.gradcheck(lambda x, a, b, c: fused_lora_linear(x, a, b, 0.7, weight=weight, bias=c), inputs)
    assert torch.autograd.gradcheck(lambda x, a, b: fused_lora_linear(x, a, b, 1.3, weight=weight), inputs[:3])


def test_disabled_and_merged_adapters_are_peft_s_paths():
    stock, _ = _peft(torch.float32, torch.float32, bias="none")
    fused = lora_speed.speed_up_lora(copy.deepcopy(stock), fused=True)
    layer = fused.base_model.model.proj
    x = torch.randn(ROWS, COLS, IN)
    with fused.disable_adapter():  # the reference pass: the base layer itself
        assert torch.equal(fused(x), layer.base_layer(x))
    layer.merge()
    assert torch.equal(fused(x), layer.base_layer(x))
    layer.unmerge()
    torch.testing.assert_close(fused(x), stock(x))


def test_swap_is_recorded_reversible_and_auto_off_on_cpu():
    model, _ = _peft(torch.float32, torch.float32)
    layer = model.base_model.model.proj
    lora_speed.speed_up_lora(model)  # "auto": CPU parameters, so only the input-cast lever
    assert set(swaps.swapped(layer)) == {"_cast_input_dtype"}
    lora_speed.speed_up_lora(model, fused=True)
    assert "fused LoRA" in swaps.swapped(layer)["forward"]
    lora_speed.restore_lora(model)
    assert swaps.swapped(layer) == {} and "forward" not in vars(layer)
    with pytest.raises(ValueError, match="fused_lora"):
        lora_speed.speed_up_lora(model, fused="yes")


def test_dropout_keeps_peft_forward_with_a_notice(caplog):
    model, _ = _peft(torch.float32, torch.float32, dropout=0.1, seed=3)
    with caplog.at_level(logging.WARNING, logger="slimrl"):
        lora_speed.speed_up_lora(model, fused=True)
    assert swaps.swapped(model.base_model.model.proj) == {}
    assert "lora_dropout > 0" in caplog.text


@pytest.mark.skipif(importlib.util.find_spec("bitsandbytes") is None, reason="bitsandbytes not installed")
def test_four_bit_base_dequantized_matches_peft():
    import bitsandbytes as bnb
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(0)
    dense = _Proj(bias=True)
    quantized = _Proj(bias=True)
    quantized.proj = bnb.nn.Linear4bit(IN, OUT, compute_dtype=torch.float32, quant_type="nf4")
    quantized.proj.load_state_dict(dense.proj.state_dict())
    quantized.proj.to("cpu")  # quantizes
    quantized.proj.support_avx512bf16_for_cpu = False
    stock = get_peft_model(quantized, LoraConfig(r=R, lora_alpha=7, target_modules=["proj"]))
    nn.init.normal_(stock.base_model.model.proj.lora_B["default"].weight, std=0.3)
    fused = lora_speed.speed_up_lora(copy.deepcopy(stock), fused=True)
    assert "forward" in swaps.swapped(fused.base_model.model.proj)
    x = torch.randn(ROWS, COLS, IN)
    got, want = _run(fused, x, None), _run(stock, x, None)
    for key in want:
        torch.testing.assert_close(got[key], want[key], rtol=1e-5, atol=1e-5 * want[key].abs().max().item())
    fused.base_model.model.proj.base_layer.compute_dtype = torch.bfloat16  # PEFT would compute the base in bf16
    assert lora_speed._plan(fused.base_model.model.proj, x, (), {}) is None  # so PEFT's forward runs


def test_trainable_base_weight_and_mixed_batches_run_peft_s_forward(monkeypatch):
    import slimrl.ops.fused_lora as op

    stock, _ = _peft(torch.float32, torch.float32, bias="none")
    fused = lora_speed.speed_up_lora(copy.deepcopy(stock), fused=True)
    calls, original = [], op.fused_lora_linear
    monkeypatch.setattr(op, "fused_lora_linear", lambda *a, **k: calls.append(1) or original(*a, **k))
    x = torch.randn(ROWS, COLS, IN)
    _run(fused, x, None)
    assert calls == [1]  # the fused path is the one counted
    for model in (stock, fused):
        model.base_model.model.proj.base_layer.weight.requires_grad_(True)
    got, want = _run(fused, x, None), _run(stock, x, None)
    assert calls == [1] and "weight" in got  # a trainable base weight: PEFT's forward, dW included
    assert all(torch.equal(got[k], want[k]) for k in want)
    fused.eval(), stock.eval()  # PEFT takes `adapter_names` (mixed-adapter batches) in eval mode only
    mixed = fused(x[:2], adapter_names=["default", "__base__"])
    assert calls == [1] and torch.equal(mixed, stock(x[:2], adapter_names=["default", "__base__"]))
