"""FastModel and FastVisionModel: Unsloth's other two loaders, for text models.

Both load with FastLanguageModel's loader (same arguments, same defaults) and add Unsloth's layer switches to
get_peft_model (layer_selection.py). Image-text (and audio) models are not loaded yet: their config is read first and
a NotImplementedError names the architecture before any weight is loaded.
"""

from __future__ import annotations

import os

from . import adapters, embedded, layer_selection, lora
from .fast_language_model import FastLanguageModel
from .loading import _TOKENIZER_KWARGS  # the from_pretrained keywords that also concern config files


def multimodal_part(config) -> str | None:
    """ "vision" / "audio" when the config describes a model with such an encoder, else None."""
    for part in ("vision", "audio"):
        if getattr(config, f"{part}_config", None) is not None:
            return part
    return None


def refuse_multimodal(config, caller: str) -> None:
    part = multimodal_part(config)
    if part is not None:
        arch = ", ".join(getattr(config, "architectures", None) or []) or type(config).__name__
        raise NotImplementedError(
            f"{caller}: {arch} (model_type {getattr(config, 'model_type', '?')!r}) is an image-text model with a "
            f"{part} encoder; slimrl loads and trains text-only causal LMs for now. Use a text-only checkpoint of "
            "the same family."
        )


def _check_text_only(model_name, kwargs: dict, caller: str) -> None:
    """Read the config (a small file) and refuse an image-text model before any weight is loaded."""
    name = os.fspath(model_name)
    local = os.path.exists(name)
    if (embedded.is_embedded_name(name) and not local) or name.lower().endswith(".gguf"):
        return
    if local and adapters.is_adapter_folder(name):
        return  # its base is loaded by FastLanguageModel, which loads causal LMs only
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(name, **{k: kwargs[k] for k in _TOKENIZER_KWARGS if k in kwargs})
    except (OSError, ValueError, KeyError):
        return  # the loader says what is wrong with this source
    refuse_multimodal(config, caller)


class FastModel(FastLanguageModel):
    """Unsloth's FastModel for text models: FastLanguageModel plus get_peft_model's layer switches."""

    _caller = "FastModel"

    @classmethod
    def from_pretrained(cls, model_name="smollm2-135m", *args, **kwargs):
        """FastLanguageModel.from_pretrained, after refusing image-text models (NotImplementedError)."""
        _check_text_only(model_name, kwargs, f"{cls._caller}.from_pretrained")
        return FastLanguageModel.from_pretrained(model_name, *args, **kwargs)

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
        finetune_audio_layers=True given on a text-only model are said in a notice (nothing to target)."""
        from peft import PeftModel

        if not isinstance(model, PeftModel):
            refuse_multimodal(getattr(model, "config", None), f"{cls._caller}.get_peft_model")
            target_modules = layer_selection.select_target_modules(
                model,
                target_modules,
                vision=finetune_vision_layers,
                language=finetune_language_layers,
                attention=finetune_attention_modules,
                mlp=finetune_mlp_modules,
                audio=finetune_audio_layers,
            )
        return lora.get_peft_model(
            model,
            r=r,
            target_modules=target_modules,
            lora_alpha=lora_alpha,
            lora_dropout=lora_dropout,
            bias=bias,
            use_gradient_checkpointing=use_gradient_checkpointing,
            random_state=random_state,
            **peft_kwargs,
        )


class FastVisionModel(FastModel):
    """Unsloth's FastVisionModel: for text models for now (the same as FastModel); image-text models raise
    NotImplementedError naming the architecture."""

    _caller = "FastVisionModel"
