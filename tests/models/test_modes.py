"""for_inference / for_training: the right switches, idempotent, and an exact round trip in every mode."""

import pytest
import torch

from slimrl import FastLanguageModel
from slimrl.models import checkpointing
from slimrl.models.modes import mode_state
from slimrl.state import model_state

from _models_helpers import batch, lora_grads_around_generate


@pytest.mark.parametrize("mode", [False, True, "offload"])
def test_round_trip_restores_training_state(tiny_peft, mode):
    model = FastLanguageModel.for_training(tiny_peft(mode))
    before = mode_state(model)
    assert FastLanguageModel.for_inference(model) is model
    inference = mode_state(model)
    assert FastLanguageModel.for_inference(model) is model  # idempotent
    assert mode_state(model) == inference
    assert FastLanguageModel.for_training(model) is model
    assert mode_state(model) == before
    FastLanguageModel.for_training(model)
    assert mode_state(model) == before


@pytest.mark.parametrize("mode", [False, True, "offload"])
def test_switches(tiny_peft, mode):
    model = tiny_peft(mode)
    tokenizer = model_state(model).tokenizer
    FastLanguageModel.for_inference(model)
    assert not any(m.training for m in model.modules())
    assert model.config.use_cache is True and tokenizer.padding_side == "left"
    assert not checkpointing.is_checkpointing_active(model)
    assert checkpointing.checkpointing_mode(model) == mode  # configured mode is kept while off
    FastLanguageModel.for_training(model)
    assert all(m.training for m in model.modules())
    assert model.config.use_cache is False and tokenizer.padding_side == "right"
    assert checkpointing.is_checkpointing_active(model) is (mode is not False)


def test_generate_then_train_gives_same_gradients(tiny_peft):
    first, second = lora_grads_around_generate(tiny_peft("offload"), batch())
    for name, g in first.items():
        torch.testing.assert_close(second[name], g, atol=0, rtol=0)


def test_for_training_can_change_mode(tiny_peft):
    model = tiny_peft(True)
    FastLanguageModel.for_training(model, use_gradient_checkpointing="unsloth")
    assert model_state(model).checkpointing == "offload"


def test_plain_model_without_tokenizer_or_mode():
    from slimrl.testing import tiny_llama

    model = tiny_llama(hidden_size=32, num_layers=2)
    FastLanguageModel.for_inference(model)
    assert not model.training and model.config.use_cache
    FastLanguageModel.for_training(model)
    assert model.training and not model.config.use_cache
    assert not checkpointing.is_checkpointing_active(model)
