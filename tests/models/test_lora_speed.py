"""slimrl's LoRA speed levers on a whole model (slimrl.models.lora_speed through get_peft_model): the input cast
skipped under bf16 autocast, and the fused forward, against PEFT's eager path and a float64 reference.

A tiny Llama in bf16 with PEFT's fp32 adapters (every projection a LoRA layer, B nonzero), its loss and every adapter
gradient under bf16 autocast. The rule (as tests/ops/test_fused_lora.py): e(levers) <= 2 e(PEFT) + 2 u_bf16 |ref|
against the float64 reference. Skipping the cast is exact (bf16 -> fp32 -> bf16 is the identity), so it is also
checked bit for bit. Negative control: one layer's scaling 5% off fails the rule.
"""

from __future__ import annotations

import copy

import pytest
import torch
from peft.tuners.lora import Linear as LoraLinear

import slimrl
from slimrl import FastLanguageModel
from slimrl.testing import tiny_llama

U_BF16 = torch.finfo(torch.bfloat16).eps / 2


def _model(**levers):
    model = tiny_llama(seed=0, dtype=torch.bfloat16, hidden_size=32, num_layers=2, vocab_size=97)
    return FastLanguageModel.get_peft_model(
        model, r=4, lora_alpha=8, init_lora_weights=False, use_gradient_checkpointing=False, **levers
    )


def _run(model, autocast: bool):
    """(loss, every adapter gradient) of a causal LM loss on fixed ids."""
    model.zero_grad(set_to_none=True)
    ids = torch.randint(3, 97, (3, 11), generator=torch.Generator().manual_seed(0))
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    grads = {n: p.grad.double() for n, p in model.named_parameters() if p.grad is not None}
    return {"loss": loss.detach().double(), **grads}


def _violations(ours, stock, ref) -> list[str]:
    assert ours.keys() == stock.keys() == ref.keys() and len(ours) == 1 + 2 * 2 * 7
    bad = []
    for key in ours:
        e_ours, e_stock = (ours[key] - ref[key]).norm(), (stock[key] - ref[key]).norm()
        if e_ours > 2 * e_stock + 2 * U_BF16 * ref[key].norm():
            bad.append(key)
    return bad


@pytest.fixture(scope="module")
def sides():
    stock = _model(skip_lora_input_casts=False, fused_lora=False)
    reference = _run(copy.deepcopy(stock).double(), autocast=False)
    return stock, _run(stock, autocast=True), reference


def _casts(monkeypatch) -> list:
    """Count the casts PEFT's own `_cast_input_dtype` performs."""
    done, original = [], LoraLinear._cast_input_dtype

    def counting(self, x, dtype):
        out = original(self, x, dtype)
        done.append(out is not x)
        return out

    monkeypatch.setattr(LoraLinear, "_cast_input_dtype", counting)
    return done


def test_input_casts_skipped_under_autocast_exactly(sides, monkeypatch):
    _, stock, reference = sides
    ours = _model(fused_lora=False)  # the default: casts skipped
    casts = _casts(monkeypatch)
    got = _run(ours, autocast=True)
    assert casts == []  # no LoRA layer reached PEFT's cast
    assert _violations(got, stock, reference) == []
    assert all(torch.equal(got[k], stock[k]) for k in got)
    _run(ours, autocast=False)  # without autocast PEFT's cast runs (fp32 adapter math): 14 layers, each cast
    assert len(casts) == 14 and all(casts)


def test_both_levers_under_autocast(sides):
    _, stock, reference = sides
    assert _violations(_run(_model(fused_lora=True), autocast=True), stock, reference) == []


@pytest.mark.parametrize("fused", [False, True])
def test_negative_control_wrong_scaling_fails(sides, fused):
    _, stock, reference = sides
    ours = _model(fused_lora=fused)
    ours.base_model.model.model.layers[0].self_attn.q_proj.scaling["default"] *= 1.05
    assert _violations(_run(ours, autocast=True), stock, reference)


def test_levers_listed_by_describe_and_validated():
    described = slimrl.describe(_model()).instance_level  # CPU: "auto" leaves the fused forward off
    assert "input cast skipped" in described["_cast_input_dtype on 14 submodules"]
    assert not any(k.startswith("forward on") for k in described)
    described = slimrl.describe(_model(fused_lora=True, skip_lora_input_casts=False)).instance_level
    assert "fused LoRA" in described["forward on 14 submodules"]
    assert not any(k.startswith("_cast_input_dtype") for k in described)
    with pytest.raises(ValueError, match="skip_lora_input_casts"):
        _model(skip_lora_input_casts="sometimes")
