"""Image-text models for FastModel / FastVisionModel: loading through transformers' AutoModelForImageTextToText and
AutoProcessor, and Unsloth's vision/language switches as LoRA targets.

FastModel calls three functions here and nothing here calls FastModel back: `multimodal_config` (the config, read
before any weight, of a model with a vision or audio encoder; None sends the load to FastLanguageModel's loader),
`load_image_text_model` (the whole image-text load: the checks, the weights, the processor, checkpointing) and
`lora_targets` (get_peft_model's target modules for Unsloth's switches: image-text models here, text models through
layer_selection.py).

Loading (`load_image_text_model`) keeps FastLanguageModel's conventions: the same dtype choice, safetensors only
unless `allow_unsafe_weights=True`, NF4 through bitsandbytes with `load_in_4bit`, the same Unsloth-only keywords
warned about; it returns `(model, processor)` as Unsloth does, and the processor is the one the patched trainers use
when no `processing_class` is given and whose tokenizer for_inference / for_training pad left / right.
Supported: every model type transformers 5 maps in AutoModelForImageTextToText without remote code (SUPPORTED lists
those slimrl's tests train: Gemma 3, Qwen2-VL, Qwen2.5-VL, Qwen3-VL); another image-text config raises naming it.
Not supported (a NotImplementedError naming the model): GGUF files, `fast_inference=True` (vLLM rollouts of image
prompts), audio encoders.

Layer selection follows unsloth_zoo's get_peft_regex: a Linear whose path has a part containing one of VISION_TAGS
is a vision layer; a Linear inside the language model's decoder blocks is a language layer; attention / MLP by the
path parts of layer_selection.py. The result is the list of selected module names (leaf names where every Linear of
that name is selected).
"""

from __future__ import annotations

import logging
import os

from . import adapters, chat_template_ids, checkpointing, embedded, layer_selection, loading, quantization
from .lora import decoder_layers, is_linear

logger = logging.getLogger("slimrl")

SUPPORTED = ("gemma3", "qwen2_vl", "qwen2_5_vl", "qwen3_vl")
VISION_TAGS = ("vision", "visual", "image", "patch")


def image_text_types() -> frozenset:
    from transformers.models.auto.modeling_auto import MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES

    return frozenset(MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES)


def describe(config) -> str:
    arch = ", ".join(getattr(config, "architectures", None) or []) or type(config).__name__
    return f"{arch} (model_type {getattr(config, 'model_type', '?')!r})"


def multimodal_part(config) -> str | None:
    """ "vision" / "audio" when the config describes a model with such an encoder, else None."""
    for part in ("vision", "audio"):
        if getattr(config, f"{part}_config", None) is not None:
            return part
    return None


def multimodal_config(model_name, kwargs: dict):
    """The config (a small file) of a model with a vision or audio encoder, read before any weight; else None."""
    name = os.fspath(model_name)
    local = os.path.exists(name)
    if (embedded.is_embedded_name(name) and not local) or name.lower().endswith(".gguf"):
        return None
    if local and adapters.is_adapter_folder(name):
        return None  # its base is loaded by FastLanguageModel, which loads causal LMs only
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(name, **{k: kwargs[k] for k in loading.TOKENIZER_KWARGS if k in kwargs})
    except (OSError, ValueError, KeyError):
        return None  # the loader says what is wrong with this source
    return config if multimodal_part(config) is not None else None


def check_loadable(config, caller: str) -> None:
    """Raise (NotImplementedError, naming the model) unless `config` is an image-text model slimrl loads."""
    if getattr(config, "audio_config", None) is not None:
        raise NotImplementedError(f"{caller}: {describe(config)} has an audio encoder; slimrl loads no audio models.")
    if config.model_type not in image_text_types():
        raise NotImplementedError(
            f"{caller}: {describe(config)} has a vision encoder but transformers has no AutoModelForImageTextToText "
            f"class for it; slimrl loads image-text models through that class (tested: {', '.join(SUPPORTED)})."
        )


def _refuse_unsupported_options(name: str, config, fast_inference: bool) -> None:
    if name.lower().endswith(".gguf"):
        raise NotImplementedError(f"FastVisionModel: {name} is a GGUF file; image-text models load from safetensors.")
    if fast_inference:
        raise NotImplementedError(
            f"FastVisionModel: fast_inference=True (vLLM rollouts) is not supported for the image-text model "
            f"{describe(config)}; load with fast_inference=False: the patched GRPO trainer then rolls out with "
            "transformers' generate, each distinct prompt image encoded once."
        )


def image_processor_only(processor_class):
    """`processor_class` (a Qwen-VL processor) without its video processor: transformers 5 builds that one with
    torchvision only. Image prompts go through the class's own code."""
    from transformers.processing_utils import ProcessorMixin

    class ImageOnly(processor_class):
        def __init__(self, image_processor=None, tokenizer=None, chat_template=None, **kwargs):
            self.image_token, self.video_token = "<|image_pad|>", "<|video_pad|>"
            self.image_token_id = tokenizer.convert_tokens_to_ids(self.image_token)
            self.video_token_id = tokenizer.convert_tokens_to_ids(self.video_token)
            if hasattr(processor_class, "vision_start_token"):  # Qwen3-VL names its boundary tokens
                self.vision_start_token, self.vision_end_token = "<|vision_start|>", "<|vision_end|>"
                self.vision_start_token_id = tokenizer.convert_tokens_to_ids(self.vision_start_token)
                self.vision_end_token_id = tokenizer.convert_tokens_to_ids(self.vision_end_token)
            ProcessorMixin.__init__(self, image_processor, tokenizer, chat_template=chat_template)

    ImageOnly.__name__ = ImageOnly.__qualname__ = f"{processor_class.__name__}ImageOnly"
    return ImageOnly


def _load_processor(path: str, config, kwargs: dict):
    """AutoProcessor's processor; where transformers gives back the bare tokenizer (the Qwen-VL processors are built
    with their video processor, which needs torchvision), the family's processor without its video part."""
    import transformers
    from transformers.models.auto.processing_auto import PROCESSOR_MAPPING_NAMES

    processor = transformers.AutoProcessor.from_pretrained(path, **kwargs)
    if hasattr(processor, "image_processor"):
        return processor
    name = PROCESSOR_MAPPING_NAMES.get(config.model_type)
    if name is None or not hasattr(transformers, name):
        raise NotImplementedError(f"FastVisionModel: transformers has no processor class for {describe(config)}.")
    image_processor = transformers.AutoImageProcessor.from_pretrained(path, **kwargs)
    processor_class = image_processor_only(getattr(transformers, name))
    return processor_class(image_processor, processor, chat_template=processor.chat_template)


def _load(path: str, config, dtype, load_in_4bit: bool, device_type: str, hf_kwargs: dict, allow_unsafe: bool):
    from transformers import AutoModelForImageTextToText

    kwargs = loading.weights_kwargs(hf_kwargs, dtype, load_in_4bit, device_type, safetensors_only=not allow_unsafe)
    processor = _load_processor(path, config, {k: kwargs[k] for k in loading.TOKENIZER_KWARGS if k in kwargs})
    model = AutoModelForImageTextToText.from_pretrained(path, config=config, **kwargs)
    return model, processor


def load_image_text_model(
    model_name, config, max_seq_length=2048, dtype=None, load_in_4bit=False, *, caller: str, **kwargs
):
    """(model, processor) of an image-text model (module docstring), checkpointing configured where
    `use_gradient_checkpointing` is given; `config` is its already-read config, `caller` the name errors give."""
    check_loadable(config, caller)
    name = os.fspath(model_name)
    _refuse_unsupported_options(name, config, kwargs.pop("fast_inference", False))
    for key in ("gpu_memory_utilization", "max_lora_rank", "vllm_weight_sync", "vllm_engine_kwargs"):
        kwargs.pop(key, None)  # engine options: meaningful only with fast_inference
    hf_kwargs, options, device_type, chosen, reason = loading.load_choices(dtype, load_in_4bit, kwargs)
    logger.info("slimrl: loading image-text model %s in %s (%s)", name, str(chosen).removeprefix("torch."), reason)
    loading.check_local_source(name)
    model, processor = _load(
        name, config, chosen, load_in_4bit, device_type, hf_kwargs, options.get("allow_unsafe_weights", False)
    )
    if load_in_4bit and device_type == "cpu":
        quantization.disable_cpu_repacking(model)
    tokenizer = getattr(processor, "tokenizer", processor)
    loading.prepare_tokenizer(tokenizer, model)
    chat_template_ids.swap_in(tokenizer)
    loading.record_load(model, max_seq_length, processor, chosen, model_name)
    if "use_gradient_checkpointing" in options:
        checkpointing.apply_checkpointing(model, options["use_gradient_checkpointing"])
    return model, processor


def is_image_text_model(model) -> bool:
    config = getattr(model, "config", None)
    return config is not None and getattr(config, "vision_config", None) is not None


def lora_targets(model, target_modules, caller: str, *, audio, **switches):
    """FastModel.get_peft_model's LoRA target modules for Unsloth's switches (vision, language, attention, mlp;
    `audio`: finetune_audio_layers): an image-text model's here, a text model's by layer_selection.py; a PeftModel's
    `target_modules` unchanged. A model slimrl does not load (an audio encoder) raises naming `caller`."""
    from peft import PeftModel

    if isinstance(model, PeftModel):
        return target_modules
    if is_image_text_model(model):
        check_loadable(model.config, caller)
        return select_image_text_targets(model, target_modules, **switches)
    if multimodal_part(getattr(model, "config", None)) is not None:  # an audio encoder
        check_loadable(model.config, caller)
    return layer_selection.select_target_modules(model, target_modules, **switches, audio=audio)


def _part(full_name: str, language_blocks: set[str]) -> str | None:
    parts = full_name.split(".")
    if any(tag in part for part in parts[:-1] for tag in VISION_TAGS):
        return "vision"
    prefixes = (".".join(parts[:i]) for i in range(1, len(parts)))
    return "language" if any(p in language_blocks for p in prefixes) else None


def select_image_text_targets(model, target_modules, *, vision, language, attention, mlp) -> list[str]:
    """LoRA target module names of an image-text model for Unsloth's switches (None = on)."""
    vision, language = vision is not False, language is not False
    if not (vision or language):
        raise ValueError("get_peft_model: finetune_vision_layers and finetune_language_layers are both False.")
    if not (attention or mlp):
        raise ValueError("get_peft_model: finetune_attention_modules and finetune_mlp_modules are both False.")
    if isinstance(target_modules, str):
        raise ValueError("get_peft_model: on an image-text model pass target_modules as a list of module names.")
    blocks = {id(layer) for layer in decoder_layers(model)}
    language_blocks = {n for n, m in model.named_modules() if id(m) in blocks}
    wanted = set(target_modules) if target_modules is not None else None
    tags = (layer_selection.ATTENTION_TAGS if attention else ()) + (layer_selection.MLP_TAGS if mlp else ())
    chosen = set()
    for full, module in model.named_modules():
        part = _part(full, language_blocks) if is_linear(module) and not full.endswith("lm_head") else None
        if part is None or not (vision if part == "vision" else language):
            continue
        if any(p in tags for p in full.split(".")[:-1]) and (wanted is None or full.rsplit(".", 1)[-1] in wanted):
            chosen.add(full)
    if not chosen:
        raise ValueError(f"get_peft_model: the switches select no Linear layer of {type(model).__name__}.")
    return _target_names(model, chosen)


def _target_names(model, chosen: set[str]) -> list[str]:
    """Leaf names where every module peft would match by that leaf is chosen (peft matches a name or a suffix
    after a dot), full names for the rest."""
    by_leaf = {}
    for name, _ in model.named_modules():
        by_leaf.setdefault(name.rsplit(".", 1)[-1], []).append(name)
    names = set()
    for full in chosen:
        leaf = full.rsplit(".", 1)[-1]
        names.add(leaf if all(n in chosen for n in by_leaf[leaf]) else full)
    return sorted(names)
