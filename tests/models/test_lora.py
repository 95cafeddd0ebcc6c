"""get_peft_model: default targets, reproducible init, RNG left alone, keyword handling."""

import pytest
import torch

from slimrl import FastLanguageModel
from slimrl.models.lora import default_target_modules
from slimrl.state import model_state
from slimrl.testing import tiny_llama

LLAMA_PROJECTIONS = ["down_proj", "gate_proj", "k_proj", "o_proj", "q_proj", "up_proj", "v_proj"]


def small():
    return tiny_llama(hidden_size=32, num_layers=2)


def test_default_targets_are_all_projections_not_lm_head():
    model = small()
    assert default_target_modules(model) == LLAMA_PROJECTIONS
    peft_model = FastLanguageModel.get_peft_model(model, r=4)
    lora_modules = {n for n, _ in peft_model.named_modules() if n.endswith("lora_A")}
    assert len(lora_modules) == 2 * 7
    assert not any("lm_head" in n or "embed" in n for n in lora_modules)
    trainable = [n for n, p in peft_model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)


def test_random_state_reproducible_and_global_rng_untouched():
    def adapter(seed):
        model = small()
        torch.manual_seed(123)
        model = FastLanguageModel.get_peft_model(model, r=4, random_state=seed, use_gradient_checkpointing=False)
        after = torch.rand(1)
        return {n: p.detach().clone() for n, p in model.named_parameters() if "lora_A" in n}, after

    a, rng_a = adapter(7)
    b, rng_b = adapter(7)
    c, _ = adapter(8)
    torch.manual_seed(123)
    expected = torch.rand(1)
    assert all(torch.equal(a[n], b[n]) for n in a)
    assert any(not torch.equal(a[n], c[n]) for n in a)
    assert torch.equal(rng_a, expected) and torch.equal(rng_b, expected)


def test_max_seq_length_kept_through_peft_and_kwargs():
    model = small()
    model.max_seq_length = 256
    peft_model = FastLanguageModel.get_peft_model(model, r=4, use_rslora=True, modules_to_save=None)
    assert getattr(peft_model, "max_seq_length", None) == 256
    assert peft_model.peft_config["default"].use_rslora is True
    peft_model = FastLanguageModel.get_peft_model(small(), r=4, max_seq_length=64)
    assert peft_model.max_seq_length == 64
    with pytest.raises(TypeError, match="not_a_lora_field"):
        FastLanguageModel.get_peft_model(small(), r=4, not_a_lora_field=1)
    with pytest.warns(UserWarning, match="temporary_location"):
        FastLanguageModel.get_peft_model(small(), r=4, temporary_location="/tmp")


def test_get_peft_model_twice_returns_same_model():
    peft_model = FastLanguageModel.get_peft_model(small(), r=4)
    with pytest.warns(UserWarning, match="already has LoRA"):
        again = FastLanguageModel.get_peft_model(peft_model, r=8, use_gradient_checkpointing="offload")
    assert again is peft_model and model_state(peft_model).checkpointing == "offload"


def _checkpointing_future_warnings(make):
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        make()
    return [w for w in caught if issubclass(w.category, FutureWarning) and "checkpointing" in str(w.message)]


def test_get_peft_model_raises_no_renamed_checkpointing_warning():
    from peft import LoraConfig, get_peft_model
    from transformers import PreTrainedModel

    assert _checkpointing_future_warnings(lambda: FastLanguageModel.get_peft_model(small(), r=2)) == []
    # control: peft alone on the same model reads transformers' old name and warns, from transformers 5.23 (the
    # release that renamed it; before it the old name is the only one and nothing warns)
    config = LoraConfig(r=2, target_modules=["q_proj"], task_type="CAUSAL_LM")
    renamed = hasattr(PreTrainedModel, "is_activation_checkpointing")
    assert bool(_checkpointing_future_warnings(lambda: get_peft_model(small(), config))) is renamed
