"""fast_generate's meaning without vLLM: which weights a call asks for (Unsloth's: base unless a lora_request), a
saved adapter served merged (the default CPU hand-over), and what an engine for 4-bit training weights does."""

import importlib.util
import logging

import pytest
import torch

from slimrl import notices
from slimrl.generation import weights
from slimrl.generation.engine_setup import check_four_bit_engine, cpu_kv_cache_bytes, four_bit_engine_kwargs
from slimrl.generation.fast_generate import BASE_MODEL_NOTICE, adapter_choice
from slimrl.testing import tiny_llama

TARGETS = ["q_proj", "v_proj", "up_proj"]


def _lora(b_seed, **config):
    """The same base (seed 0) with a LoRA whose B is drawn from `b_seed` (not the fresh B = 0)."""
    from peft import LoraConfig, get_peft_model

    peft_model = get_peft_model(tiny_llama(seed=0), LoraConfig(r=4, lora_alpha=8, target_modules=TARGETS, **config))
    generator = torch.Generator().manual_seed(b_seed)
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.5)
    return peft_model


def _snapshot(model):
    return {n: (p.detach().clone(), p.requires_grad) for n, p in model.named_parameters()}


def test_a_saved_adapter_is_served_merged_and_the_model_is_left_as_it_was(tmp_path):
    _lora(b_seed=1).save_pretrained(tmp_path)
    model = _lora(b_seed=2)  # the live adapter differs from the saved one
    model.train()
    before, adapters = _snapshot(model), set(model.peft_config)
    with weights.requested_adapter(model, str(tmp_path)) as name:
        served = dict(weights.engine_weights(model, torch.float32, adapters=(name,)))
    from peft import PeftModel

    expected = PeftModel.from_pretrained(tiny_llama(seed=0), tmp_path).merge_and_unload().state_dict()
    assert set(served) == set(expected)
    for key, tensor in served.items():
        torch.testing.assert_close(tensor, expected[key], rtol=1e-6, atol=1e-6, msg=key)
    live = dict(weights.engine_weights(model, torch.float32))
    assert any(not torch.equal(live[k], served[k]) for k in served), "control: the live adapter merges differently"
    after = _snapshot(model)
    assert after.keys() == before.keys() and set(model.peft_config) == adapters and model.active_adapters == ["default"]
    assert all(torch.equal(after[n][0], before[n][0]) and after[n][1] == before[n][1] for n in before)
    assert model.training and all(m.training for m in model.modules()), "PEFT's load_adapter left the model in eval"


def test_adapters_a_merged_hand_over_cannot_serve_are_refused(tmp_path):
    with pytest.raises(FileNotFoundError, match="adapter_config.json"):
        weights._request_config(str(tmp_path))
    _lora(b_seed=1, use_dora=True).save_pretrained(tmp_path / "dora")
    with pytest.raises(NotImplementedError, match="DoRA"):
        weights.requested_adapter(_lora(b_seed=2), str(tmp_path / "dora")).__enter__()
    _lora(b_seed=1, modules_to_save=["lm_head"]).save_pretrained(tmp_path / "lm_head")
    with pytest.raises(NotImplementedError, match="lm_head"):
        weights._request_config(str(tmp_path / "lm_head"))


@pytest.fixture
def fresh_notices(monkeypatch):
    monkeypatch.setattr(notices, "_said", set())


def test_without_lora_request_the_base_model_with_one_notice(fresh_notices, caplog):
    model = _lora(b_seed=1)
    with caplog.at_level(logging.WARNING, logger="slimrl"):
        assert adapter_choice(model, None, None) is False
        assert adapter_choice(model, None, None) is False
    said = [r.getMessage() for r in caplog.records if r.name == "slimrl"]  # not bitsandbytes' own first-use line
    assert said == [f"slimrl: {BASE_MODEL_NOTICE}"]  # once per process
    assert adapter_choice(model, True, None) is True  # slimrl's explicit live adapter
    assert adapter_choice(model, False, None) is False
    request = object()  # any LoRARequest: the engine serves it
    assert adapter_choice(model, None, request) is None
    with pytest.raises(ValueError, match="both lora_request and use_adapter"):
        adapter_choice(model, True, request)


def test_no_notice_where_base_is_all_there_is(fresh_notices, caplog):
    model = _lora(b_seed=1)
    with caplog.at_level(logging.WARNING, logger="slimrl"):
        assert adapter_choice(tiny_llama(seed=0), None, None) is False  # no adapter: the weights as they are
        with model.disable_adapter():
            assert adapter_choice(model, None, None) is False
    assert caplog.records == []


def test_an_engine_for_4bit_training_weights(fresh_notices, caplog):
    check_four_bit_engine("merged", "cpu")
    with caplog.at_level(logging.WARNING, logger="slimrl"):
        assert four_bit_engine_kwargs("merged", "cpu", torch.bfloat16) == {}  # dense weights, merged hand-over
    assert "dequantized to bfloat16" in caplog.text
    with pytest.raises(ValueError, match="bitsandbytes path is CUDA-only"):
        check_four_bit_engine("lora", "cpu")
    with pytest.raises(ValueError, match="cannot be merged"):
        check_four_bit_engine("merged", "cuda")
    assert four_bit_engine_kwargs("lora", "cuda", torch.bfloat16) == {"quantization": "bitsandbytes"}


@pytest.mark.skipif(importlib.util.find_spec("bitsandbytes") is None, reason="bitsandbytes not installed")
def test_the_kv_budget_counts_4bit_weights_as_the_dense_copy_the_engine_holds(tmp_path):
    from slimrl import FastLanguageModel
    from slimrl.testing import save_tiny_model

    folder = save_tiny_model(tmp_path, hidden_size=64, num_layers=2)
    dense, _ = FastLanguageModel.from_pretrained(folder, dtype="float32", max_seq_length=64)
    four_bit, _ = FastLanguageModel.from_pretrained(folder, dtype="float32", load_in_4bit=True, max_seq_length=64)
    assert sum(p.numel() for p in four_bit.parameters()) < sum(p.numel() for p in dense.parameters())  # packed
    assert sum(weights.dense_numel(p) for p in four_bit.parameters()) == sum(p.numel() for p in dense.parameters())
    ram = 2**30
    assert cpu_kv_cache_bytes(four_bit, torch.float32, 0.5, ram) == cpu_kv_cache_bytes(dense, torch.float32, 0.5, ram)
