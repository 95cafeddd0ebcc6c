"""QLoRA on CPU: NF4 loading, and LoRA gradients that survive a generate (bitsandbytes' CPU repack trap)."""

import importlib.util
import re

import pytest
import torch

from slimrl import FastLanguageModel
from slimrl.models import quantization

from _models_helpers import batch, lora_grads_around_generate

needs_bnb = pytest.mark.skipif(importlib.util.find_spec("bitsandbytes") is None, reason="bitsandbytes not installed")


def qlora(tiny_model_dir, mode):
    model, tokenizer = FastLanguageModel.from_pretrained(
        tiny_model_dir, dtype="float32", load_in_4bit=True, max_seq_length=64
    )
    return FastLanguageModel.get_peft_model(
        model, r=4, use_gradient_checkpointing=mode, init_lora_weights=False, random_state=0
    )


@needs_bnb
@pytest.mark.parametrize("mode", [False, "offload"])
def test_qlora_gradients_survive_generate(tiny_model_dir, mode):
    import bitsandbytes as bnb

    model = qlora(tiny_model_dir, mode)
    layers = [m for m in model.modules() if isinstance(m, bnb.nn.Linear4bit)]
    assert len(layers) == 2 * 7 and all(m.support_avx512bf16_for_cpu is False for m in layers)
    before, after = lora_grads_around_generate(model, batch())
    assert all(torch.any(g != 0) for g in before.values())
    for name, g in before.items():
        torch.testing.assert_close(after[name], g, atol=1e-6, rtol=0)


@needs_bnb
def test_qlora_attributes(tiny_model_dir):
    model = qlora(tiny_model_dir, True)
    assert model.is_loaded_in_4bit and model.max_seq_length == 64
    assert model.get_base_model().config.quantization_config.bnb_4bit_compute_dtype in ("float32", torch.float32)


def test_missing_bitsandbytes_message(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        quantization.importlib.util, "find_spec", lambda name, *a: None if name == "bitsandbytes" else real(name, *a)
    )
    from slimrl.versions import EXTRAS_SUPPORTED

    wanted = re.escape(f"pip install 'bitsandbytes{EXTRAS_SUPPORTED['bitsandbytes']}'")
    with pytest.raises(ImportError, match=wanted):
        quantization.bnb_4bit_config(torch.float32)
