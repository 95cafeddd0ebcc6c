"""FastVisionModel / FastModel on image-text models: (model, processor) through AutoModelForImageTextToText and
AutoProcessor from a saved tiny model; Unsloth's vision / language / attention / MLP switches as LoRA targets;
for_inference / for_training pad the processor's tokenizer; unsupported options raise naming the model."""

import pytest
import torch

from slimrl import FastModel, FastVisionModel
from slimrl.testing_vision import save_tiny_vlm

VISION_PREFIXES = ("model.visual.", "model.vision_tower.")


@pytest.fixture(scope="module", params=["qwen2_vl", pytest.param("gemma3", marks=pytest.mark.slow)])
def tiny_vlm_dir(request, tmp_path_factory):
    return save_tiny_vlm(tmp_path_factory.mktemp(request.param), request.param)


def lora_parts(peft_model) -> dict[str, set[str]]:
    """'vision' / 'language' -> the leaf names of the Linears that got LoRA."""
    parts = {"vision": set(), "language": set()}
    for name, _ in peft_model.named_modules():
        if name.endswith(".lora_A"):
            inner = name.removeprefix("base_model.model.").removesuffix(".lora_A")
            part = "vision" if inner.startswith(VISION_PREFIXES) else "language"
            parts[part].add(inner.rsplit(".", 1)[-1])
    return parts


@pytest.mark.parametrize("loader", [FastModel, FastVisionModel])
def test_loads_model_and_processor(tiny_vlm_dir, loader):
    from transformers import AutoModelForImageTextToText

    model, processor = loader.from_pretrained(tiny_vlm_dir, max_seq_length=64, dtype=torch.float32)
    assert type(model) in AutoModelForImageTextToText._model_mapping.values()
    assert hasattr(processor, "image_processor") and model.max_seq_length == 64
    FastVisionModel.for_inference(model)
    assert processor.tokenizer.padding_side == "left" and not model.training
    FastVisionModel.for_training(model)
    assert processor.tokenizer.padding_side == "right" and model.training


@pytest.mark.parametrize(
    "vision, language, attention, mlp",
    [(True, True, True, True), (False, True, True, True), (True, False, True, False), (False, True, False, True)],
)
def test_switches_pick_vision_and_language_layers(tiny_vlm_dir, vision, language, attention, mlp):
    model, _ = FastVisionModel.from_pretrained(tiny_vlm_dir, dtype=torch.float32)
    peft_model = FastVisionModel.get_peft_model(
        model,
        r=4,
        finetune_vision_layers=vision,
        finetune_language_layers=language,
        finetune_attention_modules=attention,
        finetune_mlp_modules=mlp,
    )
    parts = lora_parts(peft_model)
    assert bool(parts["vision"]) == vision and bool(parts["language"]) == language
    if language:
        assert ("q_proj" in parts["language"]) == attention and ("up_proj" in parts["language"]) == mlp
    assert all(p.requires_grad == ("lora_" in n) for n, p in peft_model.named_parameters())


def test_switches_leaving_nothing_raise(tiny_vlm_dir):
    model, _ = FastVisionModel.from_pretrained(tiny_vlm_dir, dtype=torch.float32)
    with pytest.raises(ValueError, match="finetune_vision_layers and finetune_language_layers are both False"):
        FastVisionModel.get_peft_model(model, finetune_vision_layers=False, finetune_language_layers=False)


def test_fast_inference_is_refused_naming_the_model(tiny_vlm_dir):
    with pytest.raises(NotImplementedError, match=r"fast_inference=True .* \(model_type '(gemma3|qwen2_vl)'\)"):
        FastVisionModel.from_pretrained(tiny_vlm_dir, fast_inference=True)
