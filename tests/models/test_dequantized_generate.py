"""4-bit weights on CPU dequantized once per generate call (slimrl/models/dequantized_generate.py): the same tokens
and scores, to the bit, as bitsandbytes' per-token path; each weight dequantized once per call; the forwards
restored after. Negative control: a copy one rounding step off is caught by the same comparison."""

import importlib.util

import pytest
import torch

from slimrl import FastLanguageModel, swaps
from slimrl.models import dequantized_generate as dq

pytestmark = pytest.mark.skipif(importlib.util.find_spec("bitsandbytes") is None, reason="bitsandbytes not installed")

NEW = 6


@pytest.fixture(params=["bfloat16", "float32"])
def qlora(request, tiny_model_dir):
    model, _ = FastLanguageModel.from_pretrained(
        tiny_model_dir, dtype=request.param, load_in_4bit=True, max_seq_length=64
    )
    model = FastLanguageModel.get_peft_model(model, r=4, init_lora_weights=False, random_state=0)
    return FastLanguageModel.for_inference(model)


def _generate(model, per_token: bool):
    """Sampled tokens and scores: slimrl's `model.generate`, or the class's (bitsandbytes per token, no swap)."""
    base = model.get_base_model()
    ids = torch.randint(4, 500, (2, 5), generator=torch.Generator().manual_seed(0))
    kwargs = dict(input_ids=ids, max_new_tokens=NEW, min_new_tokens=NEW, do_sample=True, top_k=0)
    kwargs.update(output_scores=True, return_dict_in_generate=True, disable_compile=True)
    torch.manual_seed(1)
    with torch.no_grad():
        out = type(base).generate(base, **kwargs) if per_token else model.generate(**kwargs)
    return out.sequences, torch.stack(out.scores)


def _count_dequantize(monkeypatch, wrong: bool = False) -> list:
    calls, real = [], dq.dequantize

    def counted(module):
        calls.append(module)
        weight = real(module)
        return weight * (1 + 2**-6) if wrong else weight  # wrong: a few rounding steps off in bf16

    monkeypatch.setattr(dq, "dequantize", counted)
    return calls


def test_same_tokens_and_scores_each_weight_dequantized_once(qlora, monkeypatch):
    layers = dq.cpu_4bit_layers(qlora)
    assert len(layers) == 2 * 7
    want_ids, want_scores = _generate(qlora, per_token=True)
    calls = _count_dequantize(monkeypatch)
    got_ids, got_scores = _generate(qlora, per_token=False)
    assert torch.equal(got_ids, want_ids)
    torch.testing.assert_close(got_scores, want_scores, rtol=0, atol=0)
    assert len(calls) == len(layers) and {id(m) for m in calls} == {id(m) for m in layers}  # once, not per token
    assert all("forward" not in swaps.swapped(m) for m in layers)  # bitsandbytes' forward again


def test_negative_control_a_copy_off_by_rounding_is_caught(qlora, monkeypatch):
    want_ids, want_scores = _generate(qlora, per_token=True)
    _count_dequantize(monkeypatch, wrong=True)
    got_ids, got_scores = _generate(qlora, per_token=False)
    assert not torch.equal(got_scores, want_scores)


def test_a_forward_with_grad_and_weights_changed_between_calls_use_bitsandbytes(qlora, monkeypatch):
    layer = dq.cpu_4bit_layers(qlora)[0]
    x = torch.randn(3, layer.in_features, dtype=layer.compute_dtype)
    with dq.dequantized_once(qlora):
        assert swaps.latest_why(layer, "forward") == dq.WHY
        with torch.no_grad():
            once = layer(x)
        torch.testing.assert_close(once, type(layer).forward(layer, x), rtol=0, atol=0)
        calls = _count_dequantize(monkeypatch)
        layer(x.requires_grad_())  # with grad: bitsandbytes' forward, no copy made
        assert calls == []
    assert "forward" not in vars(layer)


def test_copies_larger_than_half_the_available_memory_keep_the_per_token_path(qlora, monkeypatch):
    monkeypatch.setattr(dq, "_available_bytes", lambda: dq.dequantized_bytes(dq.cpu_4bit_layers(qlora)))
    said, calls = [], _count_dequantize(monkeypatch)
    monkeypatch.setattr(dq, "notice", said.append)
    want = _generate(qlora, per_token=True)
    got = _generate(qlora, per_token=False)
    assert calls == [] and torch.equal(got[0], want[0])
    assert len(said) == 1 and "dequantized per token instead" in said[0]
