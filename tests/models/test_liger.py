"""Liger-Kernel on a model (slimrl.models.liger through get_peft_model), with a fake `liger_kernel` package.

liger-kernel is a GPU extra; here a fake package stands in for it: its `apply_liger_kernel_to_llama` does what
0.8.5's does (the modeling module's rotary function and classes replaced, instance forwards and attributes written)
with eager math. "CUDA" is faked by the model check only; the kernels' numbers on a GPU are tests/gpu's.
Checked: "auto" on CPU or without the package changes nothing and says so once; True there raises naming the
install; a version outside the range raises naming both; every change is listed by describe() and restore puts
back exactly what was there (negative control: a change made without the record is found); deepcopy and pickle keep
the record (swaps.MISSING survives both).
"""

from __future__ import annotations

import copy
import logging
import pickle
import sys
import types

import pytest
import torch

import slimrl
from slimrl import FastLanguageModel, notices, swaps, versions
from slimrl.models import liger
from slimrl.state import swap_records
from slimrl.testing import tiny_llama


def _fake_rope(q, k, cos, sin, position_ids=None, unsqueeze_dim=1):
    return ORIGINAL["rope"](q, k, cos, sin, unsqueeze_dim=unsqueeze_dim)


class FakeRMSNorm(torch.nn.Module):
    def forward(self, hidden_states):
        variance = hidden_states.float().pow(2).mean(-1, keepdim=True)
        normed = hidden_states.float() * torch.rsqrt(variance + self.variance_epsilon)
        return (self.weight * normed.to(hidden_states.dtype)) * (1 + self.offset)

    def extra_repr(self):
        return "fake"


class FakeSwiGLUMLP(torch.nn.Module):
    def forward(self, x):
        return self.down_proj(torch.nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))


def _bind(module, name, function):
    module.__dict__[name] = function.__get__(module, type(module))


def _apply_to_llama(
    rope=True, cross_entropy=False, fused_linear_cross_entropy=True, rms_norm=True, swiglu=True, model=None
):
    from transformers.models.llama import modeling_llama

    assert not cross_entropy and not fused_linear_cross_entropy
    CALLS.append(model)
    modeling_llama.apply_rotary_pos_emb = _fake_rope
    modeling_llama.LlamaRMSNorm = FakeRMSNorm
    modeling_llama.LlamaMLP = FakeSwiGLUMLP
    norms = [model.model.norm]
    for layer in model.model.layers:
        _bind(layer.mlp, "forward", FakeSwiGLUMLP.forward)
        norms += [layer.input_layernorm, layer.post_attention_layernorm]
    for norm in norms:
        norm.offset, norm.casting_mode, norm.in_place = 0.0, "llama", True
        _bind(norm, "forward", FakeRMSNorm.forward)
        _bind(norm, "extra_repr", FakeRMSNorm.extra_repr)


CALLS: list = []
ORIGINAL: dict = {}


@pytest.fixture
def fake_liger(monkeypatch):
    """The fake package importable, "installed" at `version`, the model taken for a CUDA one."""
    from transformers.models.llama import modeling_llama

    ORIGINAL["rope"] = modeling_llama.apply_rotary_pos_emb
    package = types.ModuleType("liger_kernel")
    package.transformers = types.ModuleType("liger_kernel.transformers")
    package.transformers.apply_liger_kernel_to_llama = _apply_to_llama
    monkeypatch.setitem(sys.modules, "liger_kernel", package)
    monkeypatch.setitem(sys.modules, "liger_kernel.transformers", package.transformers)
    installed = versions.installed
    state = {"version": "0.8.5", "cuda": True}
    monkeypatch.setattr(
        versions, "installed", lambda name: state["version"] if name == "liger-kernel" else installed(name)
    )
    monkeypatch.setattr(liger, "on_cuda", lambda model: state["cuda"])
    monkeypatch.setattr(notices, "_said", set())
    for name in ("apply_rotary_pos_emb", "LlamaRMSNorm", "LlamaMLP"):  # whatever a failing test leaves, put back
        monkeypatch.setattr(modeling_llama, name, getattr(modeling_llama, name))
    CALLS.clear()
    yield state
    for name in list(swaps.swapped(modeling_llama)):
        swaps.restore(modeling_llama, name)


def _model(**levers):
    model = tiny_llama(seed=0, hidden_size=32, num_layers=2, vocab_size=97)
    return FastLanguageModel.get_peft_model(model, r=4, lora_alpha=8, use_gradient_checkpointing=False, **levers)


def _own_attributes(model):
    from transformers.models.llama import modeling_llama

    own = {path: dict(vars(m)) for path, m in model.named_modules()}
    own["<modeling_llama>"] = dict(vars(modeling_llama))
    return own


def _same(before, after) -> list:
    """The (path, name) pairs whose own attribute differs (added, removed or another object)."""
    diff = []
    for path in before:
        for name in set(before[path]) | set(after[path]):
            if name != "__slimrl_swaps__" and before[path].get(name) is not after[path].get(name):
                diff.append((path, name))
    return diff


def _loss(model):
    ids = torch.randint(3, 97, (2, 9), generator=torch.Generator().manual_seed(0))
    return model(input_ids=ids, labels=ids).loss.detach()


def test_auto_on_cpu_changes_nothing_and_says_so_once(fake_liger, caplog):
    fake_liger["cuda"] = False
    with caplog.at_level(logging.WARNING, logger="slimrl"):
        model, again = _model(), _model()
    said = [r.getMessage() for r in caplog.records if "Liger-Kernel" in r.getMessage()]
    assert said == [
        "slimrl: Liger-Kernel not applied (liger_kernel='auto'): the model is not on CUDA (Liger's "
        "kernels are Triton: GPU only)."
    ]
    assert CALLS == [] and liger.kernels_on(model) == liger.kernels_on(again) == 0


def test_auto_without_the_package_says_how_to_install(fake_liger, caplog):
    fake_liger["version"] = None
    with caplog.at_level(logging.WARNING, logger="slimrl"):
        model = _model()
    assert CALLS == [] and liger.kernels_on(model) == 0
    assert any("pip install slimrl[gpu]" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("cuda, version", [(False, "0.8.5"), (True, None)])
def test_true_raises_where_it_cannot_apply(fake_liger, cuda, version):
    fake_liger.update(cuda=cuda, version=version)
    with pytest.raises(RuntimeError, match=r"liger_kernel=True.*pip install slimrl\[gpu\]"):
        _model(liger_kernel=True)
    assert CALLS == []


@pytest.mark.parametrize("version", ["0.8.4", "0.9.0"])
def test_a_version_outside_the_range_raises_naming_both(fake_liger, version):
    fake_liger["version"] = version
    with pytest.raises(
        ImportError,
        match=rf"liger-kernel {version} is installed; slimrl supports "
        r"liger-kernel>=0\.8\.5,<0\.9",
    ):
        _model()


def test_a_bad_setting_is_refused_before_any_work(fake_liger):
    with pytest.raises(ValueError, match="liger_kernel must be 'auto', True or False"):
        _model(liger_kernel="yes")


def test_applied_listed_and_restored_exactly(fake_liger):
    from transformers.models.llama import modeling_llama

    model = tiny_llama(seed=0, hidden_size=32, num_layers=2, vocab_size=97)
    reference = _loss(model)
    before = _own_attributes(model)
    liger.apply_liger(model, True)
    liger.apply_liger(model, True)  # idempotent
    assert len(CALLS) == 1 and liger.kernels_on(model) == 2 + 5  # two MLPs, five norms
    assert isinstance(modeling_llama.apply_rotary_pos_emb, liger.OnCuda)
    assert modeling_llama.LlamaRMSNorm is before["<modeling_llama>"]["LlamaRMSNorm"]  # classes put back at once
    torch.testing.assert_close(_loss(model), reference)  # the fake's math is eager; CPU tensors: the original RoPE
    text = str(slimrl.describe(model))
    assert "forward on 7 submodules: " + liger.WHY in text
    assert "transformers.models.llama.modeling_llama.apply_rotary_pos_emb: " + liger.ROPE_WHY in text
    changed = _same(before, _own_attributes(model))
    assert {name for _, name in changed} == {
        "forward",
        "extra_repr",
        "offset",
        "casting_mode",
        "in_place",
        "apply_rotary_pos_emb",
    }
    liger.restore_liger(model)
    assert _same(before, _own_attributes(model)) == []
    assert liger.kernels_on(model) == 0 and "Liger" not in str(slimrl.describe(model))


def test_a_change_without_the_record_is_found(fake_liger):  # the negative control of the exact restore
    model = tiny_llama(seed=0, hidden_size=32, num_layers=2, vocab_size=97)
    before = _own_attributes(model)
    liger.apply_liger(model, True)
    model.model.norm.__dict__["stray"] = 1  # written behind the record's back
    liger.restore_liger(model)
    assert _same(before, _own_attributes(model)) == [("model.norm", "stray")]


def test_the_rope_dispatcher_picks_by_device():
    calls = []
    dispatch = liger.OnCuda(lambda *a: calls.append("original"), lambda *a: calls.append("cuda"))
    dispatch(torch.zeros(1), None)
    dispatch(types.SimpleNamespace(is_cuda=True), None)
    assert calls == ["original", "cuda"]


def test_deepcopy_and_pickle_keep_the_record(fake_liger):
    assert copy.deepcopy(swaps.MISSING) is swaps.MISSING
    assert pickle.loads(pickle.dumps(swaps.MISSING)) is swaps.MISSING
    model = tiny_llama(seed=0, hidden_size=32, num_layers=2, vocab_size=97)
    liger.apply_liger(model, True)
    twin = copy.deepcopy(model)
    assert liger.kernels_on(twin) == 7
    assert twin.model.norm.forward.__self__ is twin.model.norm  # the copy's methods are bound to the copy
    liger.restore_liger(twin)
    assert liger.kernels_on(twin) == 0 and "forward" not in vars(twin.model.norm)
    assert liger.kernels_on(model) == 7  # the original keeps its own
    record = pickle.loads(pickle.dumps(swap_records(model.model.norm)))
    assert record["forward"][-1].original is swaps.MISSING
    unpickled = pickle.loads(pickle.dumps(model))  # the record travels; restore still takes every change off
    liger.restore_liger(unpickled)
    assert swaps.swapped(unpickled.model.norm) == {} and "forward" not in vars(unpickled.model.norm)


def test_plan_line_says_whether_it_applies(fake_liger):
    assert liger.plan_line("cuda", "llama").startswith("Liger-Kernel RMSNorm, RoPE and SwiGLU apply")
    assert "not on CUDA" in liger.plan_line("cpu", "llama")
    assert "no kernels for model type 'gpt2'" in liger.plan_line("cuda", "gpt2")
    fake_liger["version"] = "0.9.1"
    assert "liger-kernel 0.9.1 is installed" in liger.plan_line("cuda", "llama")


def test_the_plan_has_a_line_on_liger(fake_liger):
    from slimrl.planning import plan
    from slimrl.testing import tiny_llama_config

    fields = dict(per_device_train_batch_size=2, max_completion_length=16, bf16=False)
    for device, expected in (("cuda", "Liger-Kernel RMSNorm, RoPE and SwiGLU apply"), ("cpu", "not on CUDA")):
        result = plan(tiny_llama_config(), fields, "grpo", prompt_length=16, device=device, device_memory_gb=8)
        assert any(expected in line for line in str(result).splitlines() if line.startswith("  note: Liger"))
