"""FastModel / FastVisionModel for text models: FastLanguageModel's loader, plus Unsloth's layer switches mapped onto
LoRA target modules as unsloth_zoo's get_peft_regex selects them; a vision model transformers cannot load as an
image-text model refused before any weight loads (image-text models: test_fast_vision_model.py)."""

import logging
import re

import pytest
import torch

from slimrl import FastLanguageModel, FastModel, FastVisionModel
from slimrl.testing import tiny_llama

ATTENTION = ["k_proj", "o_proj", "q_proj", "v_proj"]
MLP = ["down_proj", "gate_proj", "up_proj"]


def lora_modules(peft_model) -> set[str]:
    return {name.removesuffix(".lora_A") for name, _ in peft_model.named_modules() if name.endswith(".lora_A")}


def unsloth_language_regex(model, attention: bool, mlp: bool) -> str:
    """unsloth_zoo's get_peft_regex for a text model (its language-layer branch), rebuilt from its documented tags:
    `model.layers.<n>.<component>.<projection>`, the projections being the Linear names that occur more than once."""
    components = (["self_attn", "attention", "attn", "mixer"] if attention else []) + (
        ["mlp", "feed_forward", "ffn", "dense", "mixer"] if mlp else []
    )
    names = [n.rsplit(".", 1)[-1] for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)]
    repeated = sorted({n for n in names if names.count(n) > 1})
    return rf"model\.layers\.\d+\.(?:{'|'.join(components)})\.(?:{'|'.join(repeated)})"


@pytest.mark.parametrize("attention, mlp", [(True, True), (True, False), (False, True)])
def test_switches_select_what_unsloth_selects(attention, mlp):
    model = tiny_llama(hidden_size=32, num_layers=2)
    linear_names = [n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)]
    expected = {n for n in linear_names if re.fullmatch(unsloth_language_regex(model, attention, mlp), n)}
    peft_model = FastModel.get_peft_model(
        model, r=4, finetune_vision_layers=False, finetune_attention_modules=attention, finetune_mlp_modules=mlp
    )
    prefix = "base_model.model."
    assert {n.removeprefix(prefix) for n in lora_modules(peft_model)} == expected
    targets = sorted(peft_model.peft_config["default"].target_modules)
    assert targets == sorted((ATTENTION if attention else []) + (MLP if mlp else []))


def test_explicit_targets_are_narrowed_by_the_switches():
    model = tiny_llama(hidden_size=32, num_layers=2)
    peft_model = FastModel.get_peft_model(
        model, r=4, target_modules=["q_proj", "v_proj", "up_proj"], finetune_mlp_modules=False
    )
    assert sorted(peft_model.peft_config["default"].target_modules) == ["q_proj", "v_proj"]


def test_every_switch_on_is_fastlanguagemodels_choice():
    ours = FastVisionModel.get_peft_model(tiny_llama(hidden_size=32, num_layers=2), r=4, random_state=5)
    theirs = FastLanguageModel.get_peft_model(tiny_llama(hidden_size=32, num_layers=2), r=4, random_state=5)
    assert lora_modules(ours) == lora_modules(theirs)
    for (name, a), (_, b) in zip(ours.named_parameters(), theirs.named_parameters()):
        assert torch.equal(a, b), name


def test_vision_layers_on_a_text_model_are_said_not_silent(caplog):
    with caplog.at_level(logging.WARNING, logger="slimrl"):
        FastModel.get_peft_model(tiny_llama(hidden_size=32, num_layers=2), r=4)  # Unsloth's default: no notice
    assert "finetune_vision_layers" not in caplog.text
    with caplog.at_level(logging.WARNING, logger="slimrl"):
        peft_model = FastModel.get_peft_model(
            tiny_llama(hidden_size=32, num_layers=2), r=4, finetune_vision_layers=True
        )
    assert "finetune_vision_layers=True, but LlamaForCausalLM is a text-only model" in caplog.text
    assert len(lora_modules(peft_model)) == 2 * 7  # its language layers, all of them


@pytest.mark.parametrize(
    "switches, message",
    [
        ({"finetune_language_layers": False}, "text-only model: its language layers are all it has"),
        ({"finetune_attention_modules": False, "finetune_mlp_modules": False}, "no modules to train"),
        ({"target_modules": r".*q_proj", "finetune_mlp_modules": False}, "regex"),
        ({"target_modules": ["up_proj"], "finetune_mlp_modules": False}, "no attention Linear layer"),
    ],
)
def test_switches_that_leave_nothing_to_train_raise(switches, message):
    with pytest.raises(ValueError, match=message):
        FastModel.get_peft_model(tiny_llama(hidden_size=32, num_layers=2), r=4, **switches)


def test_a_projection_name_shared_by_attention_and_mlp_is_targeted_by_full_name():
    from transformers import GPT2Config, GPT2LMHeadModel

    model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=64, n_positions=32))
    peft_model = FastModel.get_peft_model(
        model, r=2, finetune_mlp_modules=False, use_gradient_checkpointing=False, fan_in_fan_out=True
    )
    names = {n.removeprefix("base_model.model.") for n in lora_modules(peft_model)}
    assert names == {f"transformer.h.{i}.attn.{p}" for i in (0, 1) for p in ("c_attn", "c_proj")}  # not mlp.c_proj


def test_text_models_load_like_fastlanguagemodel(tiny_model_dir):
    model, tokenizer = FastVisionModel.from_pretrained(tiny_model_dir, max_seq_length=64)
    reference, _ = FastLanguageModel.from_pretrained(tiny_model_dir, max_seq_length=64)
    assert type(model) is type(reference) and model.max_seq_length == 64 and tokenizer.pad_token is not None
    assert FastVisionModel.for_inference(model) is model


@pytest.mark.parametrize("loader", [FastModel, FastVisionModel])
def test_unsupported_vision_models_are_refused_before_loading(tmp_path, loader):
    from transformers import CLIPConfig

    config = CLIPConfig()
    config.architectures = ["CLIPModel"]
    config.save_pretrained(tmp_path)  # a config and no weights: loading any would fail differently
    with pytest.raises(NotImplementedError, match=r"CLIPModel \(model_type 'clip'\).*AutoModelForImageTextToText"):
        loader.from_pretrained(str(tmp_path))
