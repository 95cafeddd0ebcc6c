"""FastModel and FastVisionModel: Unsloth's other two loaders.

Both read the model's config first (slimrl.models.vision.multimodal_config). A text model loads with
FastLanguageModel's loader (same arguments, same defaults); an image-text model through transformers'
AutoModelForImageTextToText and AutoProcessor (slimrl.models.vision.load_image_text_model), returning
`(model, processor)` as Unsloth does. get_peft_model adds Unsloth's layer switches (slimrl.models.vision.lora_targets:
layer_selection.py for text models, vision.py for image-text ones). Audio models and image-text models transformers
cannot load without remote code raise NotImplementedError naming the architecture before any weight is loaded.
The calls go one way, down into models/: nothing there calls this module or FastLanguageModel back.
"""

from __future__ import annotations

import inspect

from .fast_language_model import FastLanguageModel
from .models import vision

# FastLanguageModel.get_peft_model owns the LoRA arguments' defaults; FastModel's signature (Unsloth's order) reads them
_LORA_DEFAULTS = {n: p.default for n, p in inspect.signature(FastLanguageModel.get_peft_model).parameters.items()}


class FastModel(FastLanguageModel):
    """Unsloth's FastModel: FastLanguageModel for text models, AutoModelForImageTextToText for image-text models,
    plus get_peft_model's layer switches."""

    _caller = "FastModel"

    @classmethod
    def from_pretrained(cls, model_name="smollm2-135m", *args, **kwargs):
        """A text model: FastLanguageModel.from_pretrained (same arguments). An image-text model: `(model,
        processor)` loaded by slimrl.models.vision.load_image_text_model (max_seq_length, dtype, load_in_4bit,
        use_gradient_checkpointing, full_finetuning and transformers' keywords; fast_inference=True raises)."""
        config = vision.multimodal_config(model_name, kwargs)
        if config is None:
            return FastLanguageModel.from_pretrained(model_name, *args, **kwargs)
        return vision.load_image_text_model(
            model_name, config, *args, caller=f"{cls._caller}.from_pretrained", **kwargs
        )

    @classmethod
    def get_peft_model(
        cls,
        model,
        r: int = _LORA_DEFAULTS["r"],
        target_modules=_LORA_DEFAULTS["target_modules"],
        lora_alpha: int = _LORA_DEFAULTS["lora_alpha"],
        lora_dropout: float = _LORA_DEFAULTS["lora_dropout"],
        bias: str = _LORA_DEFAULTS["bias"],
        finetune_vision_layers: bool | None = None,
        finetune_language_layers: bool = True,
        finetune_attention_modules: bool = True,
        finetune_mlp_modules: bool = True,
        use_gradient_checkpointing=_LORA_DEFAULTS["use_gradient_checkpointing"],
        random_state: int = _LORA_DEFAULTS["random_state"],
        finetune_audio_layers: bool | None = None,
        **peft_kwargs,
    ):
        """FastLanguageModel.get_peft_model with Unsloth's switches (slimrl.models.layer_selection):
        finetune_attention_modules / finetune_mlp_modules pick the decoder blocks' attention and MLP Linears (both on:
        FastLanguageModel's targets); finetune_language_layers=False raises, finetune_vision_layers=True or
        finetune_audio_layers=True given on a text-only model are said in a notice (nothing to target). On an
        image-text model (slimrl.models.vision) finetune_vision_layers / finetune_language_layers pick the vision
        tower's and the language model's Linears (None = on, Unsloth's default)."""
        target_modules = vision.lora_targets(
            model,
            target_modules,
            f"{cls._caller}.get_peft_model",
            vision=finetune_vision_layers,
            language=finetune_language_layers,
            attention=finetune_attention_modules,
            mlp=finetune_mlp_modules,
            audio=finetune_audio_layers,
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
