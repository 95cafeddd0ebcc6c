"""FastModel and FastVisionModel: Unsloth's other two loaders.

Both read the model's config first. A text model loads with FastLanguageModel's loader (same arguments, same
defaults); an image-text model through transformers' AutoModelForImageTextToText and AutoProcessor (vision.py),
returning `(model, processor)` as Unsloth does. get_peft_model adds Unsloth's layer switches (layer_selection.py for
text models, vision.py for image-text ones). Audio models and image-text models transformers cannot load without
remote code raise NotImplementedError naming the architecture before any weight is loaded.
"""

from __future__ import annotations

import os

from .fast_language_model import FastLanguageModel
from .models import adapters, checkpointing, embedded, layer_selection, vision
from .models.loading import TOKENIZER_KWARGS  # the from_pretrained keywords that also concern config files


def multimodal_part(config) -> str | None:
    """ "vision" / "audio" when the config describes a model with such an encoder, else None."""
    for part in ("vision", "audio"):
        if getattr(config, f"{part}_config", None) is not None:
            return part
    return None


def _multimodal_config(model_name, kwargs: dict):
    """The config (a small file) of a model with a vision or audio encoder, read before any weight; else None."""
    name = os.fspath(model_name)
    local = os.path.exists(name)
    if (embedded.is_embedded_name(name) and not local) or name.lower().endswith(".gguf"):
        return None
    if local and adapters.is_adapter_folder(name):
        return None  # its base is loaded by FastLanguageModel, which loads causal LMs only
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(name, **{k: kwargs[k] for k in TOKENIZER_KWARGS if k in kwargs})
    except (OSError, ValueError, KeyError):
        return None  # the loader says what is wrong with this source
    return config if multimodal_part(config) is not None else None


class FastModel(FastLanguageModel):
    """Unsloth's FastModel: FastLanguageModel for text models, AutoModelForImageTextToText for image-text models,
    plus get_peft_model's layer switches."""

    _caller = "FastModel"

    @classmethod
    def from_pretrained(cls, model_name="smollm2-135m", *args, **kwargs):
        """A text model: FastLanguageModel.from_pretrained (same arguments). An image-text model: `(model,
        processor)` loaded by slimrl.models.vision.load_image_text_model (max_seq_length, dtype, load_in_4bit,
        use_gradient_checkpointing, full_finetuning and transformers' keywords; fast_inference=True raises)."""
        config = _multimodal_config(model_name, kwargs)
        if config is None:
            return FastLanguageModel.from_pretrained(model_name, *args, **kwargs)
        vision.check_loadable(config, f"{cls._caller}.from_pretrained")
        model, processor, options = vision.load_image_text_model(model_name, config, *args, **kwargs)
        if "use_gradient_checkpointing" in options:
            checkpointing.apply_checkpointing(model, options["use_gradient_checkpointing"])
        return model, processor

    @classmethod
    def get_peft_model(
        cls,
        model,
        r: int = 16,
        target_modules=None,
        lora_alpha: int = 16,
        lora_dropout: float = 0.0,
        bias: str = "none",
        finetune_vision_layers: bool | None = None,
        finetune_language_layers: bool = True,
        finetune_attention_modules: bool = True,
        finetune_mlp_modules: bool = True,
        use_gradient_checkpointing=True,
        random_state: int = 3407,
        finetune_audio_layers: bool | None = None,
        **peft_kwargs,
    ):
        """FastLanguageModel.get_peft_model with Unsloth's switches (slimrl.models.layer_selection):
        finetune_attention_modules / finetune_mlp_modules pick the decoder blocks' attention and MLP Linears (both on:
        FastLanguageModel's targets); finetune_language_layers=False raises, finetune_vision_layers=True or
        finetune_audio_layers=True given on a text-only model are said in a notice (nothing to target). On an
        image-text model (slimrl.models.vision) finetune_vision_layers / finetune_language_layers pick the vision
        tower's and the language model's Linears (None = on, Unsloth's default)."""
        from peft import PeftModel

        switches = dict(
            vision=finetune_vision_layers,
            language=finetune_language_layers,
            attention=finetune_attention_modules,
            mlp=finetune_mlp_modules,
        )
        if not isinstance(model, PeftModel) and vision.is_image_text_model(model):
            vision.check_loadable(model.config, f"{cls._caller}.get_peft_model")
            target_modules = vision.select_image_text_targets(model, target_modules, **switches)
        elif not isinstance(model, PeftModel):
            if multimodal_part(getattr(model, "config", None)) is not None:  # an audio encoder
                vision.check_loadable(model.config, f"{cls._caller}.get_peft_model")
            target_modules = layer_selection.select_target_modules(
                model, target_modules, **switches, audio=finetune_audio_layers
            )
        return FastLanguageModel.get_peft_model(  # the same call, positionally: one list of LoRA arguments
            model,
            r,
            target_modules,
            lora_alpha,
            lora_dropout,
            bias,
            use_gradient_checkpointing,
            random_state,
            **peft_kwargs,
        )


class FastVisionModel(FastModel):
    """Unsloth's FastVisionModel: the same as FastModel (image-text and text models)."""

    _caller = "FastVisionModel"
